"""Code verification in which a pass is a message that the candidate cannot forge.

A code label is ``{"tests", "entry_point", "kind", "setup"}`` (`parse_code_label`).

``kind="humaneval"`` (``check(candidate)`` tests). Three processes, and the
candidate's code never shares one with the tests:

- the **worker** sandbox loads the response's code (module ``solution``) and
  does nothing but answer calls of the entry point: it receives each call's
  arguments and returns the result as plain data (`plaincodec`: None, bool,
  int, float incl. nan/inf, str, bytes, list, tuple, dict, set, frozenset,
  complex; tuple and list kept apart);
- the **tester** sandbox (test code is data too, so it is sandboxed as well,
  under a different uid) runs the label's ``setup`` (HumanEval: the task's
  prompt, so helpers like ``poly`` or ``encode_cyclic`` that some tests call
  are the trusted definitions, never the candidate's), then the tests, with
  ``candidate`` (and the entry point's own name) bound to a proxy;
- this process (trusted) relays each call and each reply as bytes, one line
  each, without parsing them (a reply of millions of small JSON objects, or
  with a repeated key, costs it one linear scan for the newline; one check may
  relay at most `SandboxLimits.max_relay` bytes); the tester decodes a reply
  strictly (one JSON object with distinct keys, then `from_plain`, which
  refuses hash-collision floods) into fresh built-in values whose assertions
  then compare real ints, strs, lists..., and fails the check itself on a
  reply that is not plain data (the tests never see it: a test's own
  ``except`` cannot turn it into a pass). Only the small messages (hellos,
  "ready", the verdict) are parsed here, at most 16 KiB, keys distinct.

The tests never reach the worker: they are sent to the tester over a pipe, and
the sandboxes see neither the label nor the caller's files. **A check passes
only when the tester sends ``{"done": "pass", "nonce": N}``** with the random
nonce this process gave it (the worker never sees it, runs as another uid in
another PID namespace), after ``check`` returned with no failure recorded and
after at least one call. **No answer oracle**: the tester records each failed
assert and goes on, and evaluates every operand of ``and``/``or``/``all``/``any``,
chained comparisons and conditional expressions before deciding them
(`sandbox.harness.recording_tests`), so every test call is
made whatever the candidate answered; a run stops early only for what the
candidate itself decides (it raises nothing special, but it may exit, time out
or reply with something that is not plain data), never because an answer was
wrong.
Everything else fails the check: a missing, late, oversized, malformed or
non-plain reply, the worker exiting (``sys.exit``, ``os._exit``, atexit or
signal tricks only end the worker, whose exit code means nothing), an
exception from ``check``, the deadline (`SandboxLimits.wall_seconds`, for the
whole test file). Arguments are passed by value: the candidate cannot mutate
the test's objects. An exception the candidate raises reaches the test as
``CandidateError`` (so a test cannot be cut short by a forged StopIteration).

``kind="stdio"``: ``tests`` is a JSON list of ``{"input", "output"}``; each case
runs the program once (`sandbox.run_python`) with the input on stdin; the
expected output never leaves this process, where it is compared line by line
(trailing whitespace ignored); a non-zero exit, a timeout or truncated output
fails the case. As with the tester, a wrong output does not stop the run (every
case runs, so whether case i+1 runs never says whether case i passed); a
failure the program decides itself (an exit, a crash, a timeout, too much
output) ends it.

Bounded work here: the response is cleaned by linear scans (`strip_trailing_tokens`,
`extract_code`), never by a regex that can backtrack over a long run of tokens
or a long fence line.

The runner seam. `run_code_tests` hands every check to a `CodeRunner`; the
default is `LocalSandboxRunner` (above). ``MENTOR_CODE_RUNNER=module:factory``
replaces it, e.g. with a client of a remote sandbox service (SandboxFusion,
gVisor/Firecracker pools): ``factory()`` returns an object with
``run(code, label, limits) -> CodeOutcome``. A remote runner must keep the same
rule (the pass decided outside the candidate's process, on plain data) and
must return a failed outcome rather than raise.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from mentor.pipeline.code_label import CodeLabel, parse_code_label  # the label's form (standard library only)
from mentor.training.sandbox import run_python
from mentor.training.sandbox.layers import SandboxLimits, SandboxUnavailable
from mentor.training.sandbox.process import SandboxProcess, parse_message

log = logging.getLogger(__name__)

# One special token a decoded response may end with (each starts with "<" or "[" and holds no other "<").
SPECIAL_TOKEN = re.compile(r"<\|[^|<>]{1,40}\|>|</s>|<eos>|<end_of_turn>|\[/?INST\]")
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
# Imports HumanEval prompts (and most graders) provide; a response that writes
# only the function still runs. The tester gets them too, before the setup.
CODE_PRELUDE = (
    "from typing import *\n"
    "import math, re, string, itertools, functools, collections, heapq, bisect, statistics\n"
)


def strip_trailing_tokens(text: str, token: re.Pattern, starts: str = "<[", longest: int = 48) -> tuple[str, bool]:
    """`text` without the run of special tokens (and the whitespace after it) at its end, and whether it had one.

    The same as ``re.sub(r"(?:TOKEN)+\\s*$", "", text)`` where every token starts with one of
    `starts`, holds no other ``<`` and is at most `longest` characters long, but linear: each token
    is matched once, right to left (that regex, searched from every start position, is quadratic
    on a response of 10,000 tokens followed by one letter).
    """
    j = len(text.rstrip())
    found = False
    while j > 0:
        lo = max(0, j - longest)
        for ch in starts:
            i = text.rfind(ch, lo, j)
            if i >= 0 and token.fullmatch(text, i, j):
                j, found = i, True
                break
        else:
            break
    return (text[:j], True) if found else (text, False)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block: what ``re.findall(r"```[ \\t]*([A-Za-z0-9_+-]*)[^\\n]*\\n(.*?)```",
    text, re.DOTALL)`` returns, in one left-to-right pass (that regex is quadratic on a long fence line)."""
    blocks, pos = [], 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return blocks
        nl = text.find("\n", i + 3)
        if nl < 0:
            return blocks  # no line end after this fence, nor after any later one
        end = text.find("```", nl + 1)
        if end < 0:
            return blocks  # no closing fence: neither this opening nor one inside its line has one
        blocks.append((_LANG.match(text, i + 3, nl).group(1), text[nl + 1:end]))
        pos = end + 3


def extract_code(response: str) -> str:
    """The code in a response: the last python (or untagged) fenced block, else the whole text."""
    text, _ = strip_trailing_tokens(response or "", SPECIAL_TOKEN)
    blocks = fenced_blocks(text)
    if not blocks and "```" in text:
        # An unterminated fence (truncated response): take what follows it.
        tail = text.rsplit("```", 1)[1]
        blocks = [(tail.split("\n", 1)[0].strip(), tail.split("\n", 1)[1] if "\n" in tail else "")]
    if blocks:
        py = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3", "")]
        return (py or [blocks[-1][1]])[-1]
    return text


@dataclass
class CodeOutcome:
    passed: int
    total: int
    detail: str  # first failure (or "ok"), short
    layers: list[str] = field(default_factory=list)  # sandbox layers in force for the run

    @property
    def score(self) -> float:
        return 1.0 if self.total and self.passed == self.total else 0.0


class CodeRunner(Protocol):
    """Where code checks run (see the module docstring: the runner seam)."""

    def run(self, code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome: ...


# --------------------------------------------------------------------------- humaneval: worker + tester


_WARNED_NO_SETUP = threading.Event()
_CALL = b'{"call":'  # how the tester's call messages start (its json.dumps, compact separators)


_LOGGED: set[str] = set()


def _log_once(key: str, msg: str, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.error(msg, *args)


def _fail(detail: str, layers: list[str] | None = None) -> CodeOutcome:
    return CodeOutcome(0, 1, detail[:300], layers or [])


def run_humaneval(code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome:
    """One ``check(candidate)`` run under the pass protocol; never raises for anything the code does."""
    if label.setup is None and not _WARNED_NO_SETUP.is_set():
        _WARNED_NO_SETUP.set()
        log.warning("mentor code verifier: a humaneval label has no 'setup' (labels made before the tests ran apart "
                    "from the candidate): tests that call helpers of the prompt (HumanEval/32, /38, /50) fail; "
                    "rebuild the problems with `python -m mentor.workflows.convert_shared`")
    one = replace(limits, processes=1)  # no fork, no threads in either sandbox
    deadline = time.monotonic() + limits.wall_seconds
    nonce = secrets.token_hex(16)
    with SandboxProcess("worker", one, deadline) as worker, SandboxProcess("tester", one, deadline) as tester:
        for box in (worker, tester):
            if not box.hello(deadline):
                why = f"{box.role} sandbox did not start: {box.failure}; {bytes(box.stderr)[-200:]!r}"
                _log_once(why.split(";")[0], "mentor code verifier: %s (every code check fails while this lasts)", why)
                return _fail(why)
        layers = [x for x in worker.layers if x in tester.layers]
        if not (worker.send({"code": code, "entry": label.entry_point, "prelude": CODE_PRELUDE}, deadline)
                and tester.send({"setup": label.setup, "tests": label.tests, "entry": label.entry_point,
                                 "nonce": nonce, "prelude": CODE_PRELUDE}, deadline)):
            return _fail("timeout", layers)
        ready, calls, relayed = False, 0, 0
        while True:
            line = tester.recv_line(deadline)
            if line is None:
                return _fail(f"tests: {tester.failure}", layers)
            if line.startswith(_CALL):
                # Calls and replies are relayed as bytes, never parsed here: the worker and the tester
                # decode them (each under its own limits) and the tester fails the check on a reply
                # that is not plain data. This process only frames them, in linear time, and bounds
                # how many bytes one check may move through it.
                if not ready:
                    r = worker.recv(deadline)
                    if r is None:
                        return _fail(f"candidate: {worker.failure} before it was ready", layers)
                    if r != {"ready": True}:
                        return _fail(f"candidate did not load: {str(r.get('error', 'malformed message'))[:250]}", layers)
                    ready = True
                if not worker.send_line(line + b"\n", deadline):
                    return _fail(f"call {calls}: candidate {worker.failure}", layers)
                reply = worker.recv_line(deadline)
                calls += 1
                if reply is None:
                    return _fail(f"call {calls}: candidate {worker.failure}", layers)
                relayed += len(line) + len(reply)
                if relayed > limits.max_relay:
                    return _fail(f"call {calls}: calls and replies passed {limits.max_relay >> 20} MiB", layers)
                if not tester.send_line(reply + b"\n", deadline):
                    return _fail(f"tests: {tester.failure}", layers)
                continue
            msg = parse_message(line)
            if msg is None:
                return _fail("malformed message from the tests", layers)
            if msg.get("done") == "pass":
                if not hmac.compare_digest(str(msg.get("nonce", "")).encode(), nonce.encode()):
                    return _fail("a pass message without the tester's nonce", layers)
                if calls == 0:
                    return _fail("the tests never called the candidate", layers)
                return CodeOutcome(1, 1, "ok", layers)
            if msg.get("done") == "fail":
                return _fail(f"tests failed after {calls} calls: {str(msg.get('why'))[:250]}", layers)
            return _fail("malformed message from the tests", layers)


# --------------------------------------------------------------------------- stdio


def _compare_output(got: str, want: str) -> bool:
    norm = lambda s: [ln.rstrip() for ln in s.strip().splitlines()]  # noqa: E731
    return norm(got) == norm(want)


def run_stdio(code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome:
    """Every case in turn; a wrong output is recorded and the next case runs (see the module docstring)."""
    cases = label.tests
    program = f"{CODE_PRELUDE}\n{code}\n"
    layers: list[str] = []
    passed, first = 0, ""
    for i, case in enumerate(cases):  # type: ignore[arg-type]
        res = run_python(program, stdin=case.get("input", ""), limits=limits)
        layers = res.layers
        # What the program decides itself ends the run: whether it went on never depends on an expected output.
        if not res.ok:
            why = "timeout" if res.timed_out else (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            return CodeOutcome(passed, len(cases), (first or f"case {i}: {why}")[:300], layers)
        if res.stdout_truncated:
            return CodeOutcome(passed, len(cases), (first or f"case {i}: output over {limits.max_output} bytes")[:300], layers)
        if _compare_output(res.stdout, case.get("output", "")):
            passed += 1
        elif not first:
            first = f"case {i}: wrong output"
    return CodeOutcome(passed, len(cases), first or "ok", layers)


class LocalSandboxRunner:
    """The default runner: mentor's local sandbox (`mentor.training.sandbox`)."""

    name = "local"

    def run(self, code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome:
        if label.kind == "humaneval":
            return run_humaneval(code, label, limits)
        return run_stdio(code, label, limits)


_RUNNER: CodeRunner | None = None
_RUNNER_LOCK = threading.Lock()


def code_runner() -> CodeRunner:
    """The process's runner: `LocalSandboxRunner`, or ``MENTOR_CODE_RUNNER=module:factory``."""
    global _RUNNER
    with _RUNNER_LOCK:
        if _RUNNER is None:
            spec = os.environ.get("MENTOR_CODE_RUNNER", "")
            if spec:
                module, _, attr = spec.partition(":")
                _RUNNER = getattr(importlib.import_module(module), attr or "runner")()
                log.info("mentor code verifier: using runner %s", spec)
            else:
                _RUNNER = LocalSandboxRunner()
        return _RUNNER


def default_limits() -> SandboxLimits:
    """The limits of the reward paths: a wall-clock budget per test file of MENTOR_CODE_TIMEOUT seconds (10)."""
    wall = float(os.environ.get("MENTOR_CODE_TIMEOUT", "10"))
    return SandboxLimits(wall_seconds=wall, cpu_seconds=max(1, int(wall + 0.999)))


def run_code_tests(response: str, label: dict | str, limits: SandboxLimits | None = None) -> CodeOutcome:
    """Run the response's code against a code label; a failed outcome (never an exception) for anything wrong."""
    try:
        parsed = parse_code_label(label)
    except (ValueError, TypeError) as exc:
        return CodeOutcome(0, 0, f"unusable code label: {exc}"[:300])
    try:
        return code_runner().run(extract_code(response), parsed, limits or default_limits())
    except SandboxUnavailable as exc:
        log.error("%s", exc)
        return CodeOutcome(0, 1, f"sandbox unavailable: {exc}"[:300])


def verify_code(response: str, label: dict | str, limits: SandboxLimits | None = None) -> float:
    """1.0 when the response's code passes every test of `label` (a dict or the code_label JSON)."""
    return run_code_tests(response, label, limits).score


__all__ = [
    "CODE_PRELUDE",
    "CodeLabel",
    "CodeOutcome",
    "CodeRunner",
    "LocalSandboxRunner",
    "SPECIAL_TOKEN",
    "code_runner",
    "default_limits",
    "extract_code",
    "parse_code_label",
    "run_code_tests",
    "strip_trailing_tokens",
    "verify_code",
]
