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
- this process (trusted) relays each call: it decodes the worker's reply
  strictly into fresh built-in values, re-encodes them and hands them to the
  tester, whose assertions then compare real ints, strs, lists...

The tests never reach the worker: they are sent to the tester over a pipe, and
the sandboxes see neither the label nor the caller's files. **A check passes
only when the tester sends ``{"done": "pass", "nonce": N}``** with the random
nonce this process gave it (the worker never sees it, runs as another uid in
another PID namespace), after ``check`` returned and after at least one call.
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
fails the case.

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
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from mentor.training.plaincodec import PlainError, from_plain, to_plain
from mentor.training.sandbox import SandboxLimits, SandboxProcess, SandboxUnavailable, run_python

log = logging.getLogger(__name__)

_SPECIAL_TOKENS = re.compile(r"(?:<\|[^|<>]{1,40}\|>|</s>|<eos>|<end_of_turn>|\[/?INST\])+\s*$")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
# Imports HumanEval prompts (and most graders) provide; a response that writes
# only the function still runs. The tester gets them too, before the setup.
CODE_PRELUDE = (
    "from typing import *\n"
    "import math, re, string, itertools, functools, collections, heapq, bisect, statistics\n"
)


def extract_code(response: str) -> str:
    """The code in a response: the last python (or untagged) fenced block, else the whole text."""
    text = _SPECIAL_TOKENS.sub("", response or "")
    blocks = _FENCE.findall(text)
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


@dataclass(frozen=True)
class CodeLabel:
    tests: str | list
    entry_point: str | None
    kind: str
    setup: str | None  # trusted code run in the tester before the tests (HumanEval: the prompt)


def parse_code_label(label: dict | str) -> CodeLabel:
    """A code label from its dict or JSON form; ValueError naming what is wrong."""
    if isinstance(label, str):
        label = json.loads(label)
    if not isinstance(label, dict):
        raise ValueError("a code label is a JSON object {tests, entry_point, kind, setup}")
    kind = label.get("kind") or "humaneval"
    tests = label.get("tests")
    if not tests:
        raise ValueError("code label has no tests")
    if kind == "humaneval":
        entry = label.get("entry_point")
        if not isinstance(entry, str) or not entry.isidentifier() or not isinstance(tests, str):
            raise ValueError("humaneval label needs tests (Python source) and entry_point (a function name)")
        setup = label.get("setup")
        if setup is not None and not isinstance(setup, str):
            raise ValueError("code label 'setup' must be Python source")
        return CodeLabel(tests, entry, kind, setup)
    if kind == "stdio":
        cases = json.loads(tests) if isinstance(tests, str) else tests
        if not isinstance(cases, list) or not cases or not all(
            isinstance(c, dict) and isinstance(c.get("input", ""), str) and isinstance(c.get("output", ""), str) for c in cases
        ):
            raise ValueError("stdio tests must be a non-empty JSON list of {input: str, output: str}")
        return CodeLabel(cases, None, kind, None)
    raise ValueError(f"unknown test kind {kind!r} (expected humaneval or stdio)")


class CodeRunner(Protocol):
    """Where code checks run (see the module docstring: the runner seam)."""

    def run(self, code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome: ...


# --------------------------------------------------------------------------- humaneval: worker + tester


_WARNED_NO_SETUP = threading.Event()


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
                    "rebuild the problems with `python -m mentor.data.convert_shared`")
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
        ready, calls = False, 0
        while True:
            msg = tester.recv(deadline)
            if msg is None:
                return _fail(f"tests: {tester.failure}", layers)
            if "call" in msg:
                try:
                    args, kwargs = from_plain(msg["call"]["a"]), from_plain(msg["call"]["k"])
                    assert type(args) is tuple and type(kwargs) is dict and all(type(k) is str for k in kwargs)
                except (PlainError, KeyError, TypeError, AssertionError):
                    return _fail("tests sent a malformed call", layers)
                if not ready:
                    r = worker.recv(deadline)
                    if r is None:
                        return _fail(f"candidate: {worker.failure} before it was ready", layers)
                    if r != {"ready": True}:
                        return _fail(f"candidate did not load: {str(r.get('error', 'malformed message'))[:250]}", layers)
                    ready = True
                if not worker.send({"a": to_plain(args), "k": to_plain(kwargs)}, deadline):
                    return _fail(f"call {calls}: candidate {worker.failure}", layers)
                reply = worker.recv(deadline)
                calls += 1
                if reply is None:
                    return _fail(f"call {calls}: candidate {worker.failure}", layers)
                forward = _checked_reply(reply)
                if isinstance(forward, str):
                    return _fail(f"call {calls}: {forward}", layers)
                if not tester.send(forward, deadline):
                    return _fail(f"tests: {tester.failure}", layers)
            elif msg.get("done") == "pass":
                if not hmac.compare_digest(str(msg.get("nonce", "")).encode(), nonce.encode()):
                    return _fail("a pass message without the tester's nonce", layers)
                if calls == 0:
                    return _fail("the tests never called the candidate", layers)
                return CodeOutcome(1, 1, "ok", layers)
            elif msg.get("done") == "fail":
                return _fail(f"tests failed after {calls} calls: {str(msg.get('why'))[:250]}", layers)
            else:
                return _fail("malformed message from the tests", layers)


def _checked_reply(reply: dict) -> dict | str:
    """The worker's reply, decoded strictly and re-encoded for the tester; a str says why it fails."""
    if set(reply) == {"ok"}:
        try:
            return {"ok": to_plain(from_plain(reply["ok"]))}
        except PlainError as exc:
            return f"the candidate's reply is not plain data ({exc})"
    if set(reply) == {"raised", "msg"} and isinstance(reply["raised"], str) and isinstance(reply["msg"], str):
        return {"raised": reply["raised"][:80], "msg": reply["msg"][:300]}
    if "bad" in reply:
        return f"the candidate returned a value that is not plain data ({str(reply['bad'])[:100]})"
    return "malformed reply from the candidate"


# --------------------------------------------------------------------------- stdio


def _compare_output(got: str, want: str) -> bool:
    norm = lambda s: [ln.rstrip() for ln in s.strip().splitlines()]  # noqa: E731
    return norm(got) == norm(want)


def run_stdio(code: str, label: CodeLabel, limits: SandboxLimits) -> CodeOutcome:
    cases = label.tests
    program = f"{CODE_PRELUDE}\n{code}\n"
    layers: list[str] = []
    for i, case in enumerate(cases):  # type: ignore[arg-type]
        res = run_python(program, stdin=case.get("input", ""), limits=limits)
        layers = res.layers
        if not res.ok:
            why = "timeout" if res.timed_out else (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            return CodeOutcome(i, len(cases), f"case {i}: {why}"[:300], layers)
        if res.stdout_truncated:
            return CodeOutcome(i, len(cases), f"case {i}: output over {limits.max_output} bytes", layers)
        if not _compare_output(res.stdout, case.get("output", "")):
            return CodeOutcome(i, len(cases), f"case {i}: wrong output", layers)
    return CodeOutcome(len(cases), len(cases), "ok", layers)


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
    "code_runner",
    "default_limits",
    "extract_code",
    "parse_code_label",
    "run_code_tests",
    "verify_code",
]
