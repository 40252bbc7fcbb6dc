"""Verifiers shared by every reward path: math (math-verify) and code (the sandbox).

``verify(domain, response, reference_label) -> float`` in [0, 1] is the one
entry point. It never raises for anything a model writes; a verifier that cannot
decide (timeout, unparsable reference) scores 0.

Math
----
The final answer is taken from the response (`extract_math_answer`: the last
``\\boxed{...}``; else "the answer is X"; else "A: X" / "#### X"; else the last
number) and compared with the reference in a math worker (`mentor.training.math_compare`):
math-verify parses both, the types are chosen per answer kind so that numbers compare exactly
(decimals as the rationals they write, a relative tolerance only where no decimal can be exact),
letters as strings and intervals never as sets, and math-verify compares what is left. The
extraction is linear in the response (a flood of newlines or whitespace costs one pass), and an
answer over a budget (``10^{10^{10}}``, ``100000000!``, ``(a+b+c+d)^{20}``, brackets or exponents
nested past 2, over 2,000 characters, ``\\cos(10^{-900})``...) is refused before any parsing
(`mentor.training.math_bounds`), scored 0 and counted in `MATH_STATS` by reason.

Why a process pool. math-verify bounds its own work with ``signal.alarm``,
which only works in the main thread, and OpenRLHF calls reward functions from
worker threads. Turning its timeout off would let one pathological expression
(``10^{10^{10}}``) hang a trainer thread forever, and a Python thread cannot be
killed. So parsing and comparison run in a few long-lived worker processes
(``python -m mentor.training.verify --worker``), where each worker is
single-threaded and one alarm per request works; the caller waits with a hard
deadline that counts from when the sample was submitted (the wait for a free
worker, served first come first served, is part of it) and SIGKILLs a worker
that overruns it. Workers are started in the background, join the pool once
they have imported math-verify (then parse a list of common shapes while idle), are shared by all
threads of a process, restarted after a fork, and exit when their parent's pipe
closes. Cost: one small JSON message each way per check (well under a
millisecond) and a few seconds of one core per worker start.

Code
----
`verify_code` (in `mentor.training.code_verify`, whose docstring has the
design) runs the response's code against the label's tests so that a pass is a
message the candidate cannot forge: ``kind="humaneval"`` runs the candidate in
a sandboxed worker that only answers calls with plain data, and the tests in a
second sandbox (the tester) that alone can report the pass, with a nonce,
and that makes every test call whatever the candidate answered (no answer
oracle); ``kind="stdio"`` runs each ``{"input", "output"}`` case as a program
and compares its output here, running every case. A response scores 1.0 only
if every test passes.
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections import Counter

from mentor.training.code_verify import (
    CODE_PRELUDE,
    SPECIAL_TOKEN,
    CodeOutcome,
    extract_code,
    run_code_tests,
    strip_trailing_tokens,
    verify_code,
)
from mentor.training.math_bounds import explosive

log = logging.getLogger(__name__)

# Math answers not compared, by reason: "refused:<bound>" (over a budget, before math-verify),
# "timeout_queue" (no worker free before the sample's deadline), "timeout_alarm" / "timeout_worker"
# (the worker's alarm, or the hard deadline that kills it), "timeout_relation" (two relations math-verify must solve,
# past `math_compare.RELATION_CPU`), "undecided" (math-verify or sympy failed).
MATH_STATS: Counter = Counter()
_MATH_STATS_LOCK = threading.Lock()


def math_count(key: str) -> None:
    with _MATH_STATS_LOCK:
        first = key not in MATH_STATS
        MATH_STATS[key] += 1
    if first and key.startswith("refused:"):
        log.warning("math answers over a budget are scored 0 without math-verify (first: %s; counted in MATH_STATS)", key[8:])

# --------------------------------------------------------------------------- answer extraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What ``answer\s+is\s*:?\s*(.+)`` matched, with the optional colon grouped: the two adjacent ``\s*``
# tried every split of a whitespace run that ends the text (3.3 s on "the answer is" + 30,000 newlines).
ANSWER_IS = re.compile(r"answer\s+is(?:\s*:)?\s*(.+)", re.IGNORECASE)
_MARKERS = re.compile(r"####|A:")
_SPACE = re.compile(r"\s*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` that closes (balanced braces), or None.

    Linear: one pass for the brace depth, one right-to-left pass that knows, for each depth, the
    nearest ``}`` that returns to it (scanning forward from every ``\\boxed{`` is quadratic on a
    response of many unclosed ones, and a reward must not let a sample buy trusted CPU time).
    """
    starts = [m.end() for m in _BOXED.finditer(text) if m.end() < len(text)]  # one at the very end cannot close
    if not starts:
        return None
    depth, before = 0, []
    for ch in text:
        before.append(depth)
        depth += (ch == "{") - (ch == "}")
    closes: dict[int, int] = {}  # depth after a "}" -> its nearest position at or right of the scan
    k = len(starts) - 1
    for i in range(len(text) - 1, -1, -1):
        if text[i] == "}":
            closes[before[i] - 1] = i
        while k >= 0 and starts[k] == i:
            end = closes.get(before[i] - 1)  # before[i] counts the box's own "{"
            if end is not None:
                return text[i:end].strip()
            k -= 1
    return None


def _clean_tail(ans: str) -> str:
    ans = ans.strip().splitlines()[0] if ans.strip() else ""
    ans = ans.strip().strip("$").strip()
    ans = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", ans).strip()
    return ans.rstrip(".。").strip().strip("$").strip()


def _tail(text: str, e: int) -> tuple[str, int] | None:
    """What ``\\s*(.+)`` matches at `e` (group, end), or None; linear in what it reads."""
    w = _SPACE.match(text, e).end()
    if w < len(text):  # text[w] is not whitespace: the rest of its line
        nl = text.find("\n", w)
        return text[w:nl if nl >= 0 else len(text)], nl if nl >= 0 else len(text)
    b = len(text.rstrip("\n")) - 1  # only whitespace is left: the regex backtracks to the last non-newline
    return (text[b], b + 1) if b >= e else None


def marker_answer(text: str) -> str | None:
    """group(1) of the last match of ``re.finditer(r"(?:^|\\n)\\s*(?:####|A:)\\s*(.+)", text)``, in one pass.

    That regex restarts at every newline and runs ``\\s*`` to the end of the whitespace after it, so a
    response of 30,000 newlines cost 2.3 s. Here each marker looks back over the whitespace run before it
    (each run precedes one marker at most) for a newline at or after where the search stands."""
    found, pos = None, 0
    for m in _MARKERS.finditer(text):
        i = m.start()
        if i < pos:
            continue
        k = i
        while k > 0 and text[k - 1].isspace():
            k -= 1
        if not (k == 0 == pos or text.find("\n", max(k, pos), i) >= 0):
            continue
        tail = _tail(text, m.end())
        if tail is not None:
            found, pos = tail
    return found


def extract_math_answer(response: str) -> str | None:
    """The response's final answer as text (see module docstring for the order), or None."""
    text, _ = strip_trailing_tokens(response or "", SPECIAL_TOKEN)
    boxed = last_boxed(text)
    if boxed:
        return boxed
    matches = list(ANSWER_IS.finditer(text))
    if matches:
        ans = _clean_tail(matches[-1].group(1))
        if ans:
            return ans
    marked = marker_answer(text)
    if marked is not None:
        ans = _clean_tail(marked)
        if ans:
            return ans
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].strip()
    return None


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s).replace("\\!", "").replace("dfrac", "frac").replace("tfrac", "frac")


# --------------------------------------------------------------------------- math-verify workers


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """Serve ``{"gold", "pred", "timeout"}`` lines with ``{"ok": bool|None, "error": str|None}``, after a
    ``{"ready": true}`` line; while no request waits, parse the next shape of the warm-up list."""
    logging.disable(logging.WARNING)
    from mentor.training.math_compare import WARM_UP, equal, warm_up  # slow to import (sympy): only in the workers

    out, fd, buf, pending = sys.stdout, sys.stdin.fileno(), b"", list(WARM_UP)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    while True:
        while b"\n" not in buf:
            if pending and not select.select([fd], [], [], 0)[0]:
                warm_up(pending.pop(0))  # one shape (a few ms to 0.1 s), then look for a request again
                if not pending:
                    # sympy's imports and caches out of the collector's sight: a full collection over them cost a
                    # request 0.07 s of CPU, more than its relation budget (`math_compare.RELATION_CPU`).
                    gc.collect()
                    gc.freeze()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return  # the parent closed the pipe
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        try:
            req = json.loads(line)
            # Main thread of a single-threaded process: the request's alarm works here.
            ok, error = equal(req["gold"], req["pred"], float(req.get("timeout", 5)))
            resp = {"ok": ok, "error": error}
        except Exception as exc:
            resp = {"ok": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(resp) + "\n")
        out.flush()


START_LIMIT = 120.0  # seconds a worker may take to import sympy and warm up before it is given up


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mentor.training.verify", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self.buf = b""

    def read(self, deadline: float) -> dict | None:
        """The worker's next line; None when the deadline passes or the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the worker died
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def ask(self, req: dict, deadline: float) -> dict | None:
        """Send one request; None when the deadline passes (the worker is then unusable)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        return self.read(deadline)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass


class MathVerifierPool:
    """A few math-verify worker processes shared by every thread of this process."""

    def __init__(self, size: int = 2, timeout: float = 10.0) -> None:
        self.size = size
        self.timeout = timeout
        self.pid = os.getpid()
        # Free slots (None: the worker is started on first use) and the callers waiting for one, served
        # first come, first served: a queue.Queue wakes an arbitrary waiter, and under a deadline that
        # counts from submission an unlucky sample would starve.
        self._free: list[_Worker | None] = [None] * size
        self._waiting: collections.deque[tuple[threading.Event, list]] = collections.deque()
        self._slots = threading.Lock()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self.timeouts = 0
        self.queue_timeouts = 0

    def check(self, gold: str, pred: str) -> bool | None:
        """math-verify equivalence; None when undecided (timeout or error).

        The deadline (`timeout` seconds) counts from this call, so the wait for a free worker is part
        of it: behind slow samples a sample is undecided at its deadline, never later. A worker is
        started (and warmed up) in the background and joins the pool when ready, so a sample never
        waits on a start it could be killed for."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                worker = self._acquire(deadline)
            except queue.Empty:
                self.queue_timeouts += 1
                math_count("timeout_queue")
                log.warning("math-verify: no worker free within %.0fs; %r scored 0", self.timeout, pred[:80])
                return None
            if worker is not None and worker.proc.poll() is None:
                break
            self._start()  # the slot goes with the starting worker
        try:
            left = deadline - time.monotonic()
            if left <= 0.05:
                self.queue_timeouts += 1
                math_count("timeout_queue")
                return None
            # The worker's own alarm (what is left, less a margin) fires first; the hard deadline is the backstop.
            resp = worker.ask({"gold": gold, "pred": pred, "timeout": max(0.05, left - 0.25)}, deadline)
            if resp is None:
                self.timeouts += 1
                math_count("timeout_worker")
                log.warning("math-verify worker overran %.0fs on %r vs %r; killed it", self.timeout, pred[:80], gold[:80])
                worker.kill()
                return None
            if resp.get("error"):
                math_count({"timeout": "timeout_alarm", "relation over its CPU budget": "timeout_relation"}.get(resp["error"], "undecided"))
                log.debug("math-verify: %s", resp["error"])
            return resp.get("ok")
        except Exception as exc:  # a broken pipe etc.: undecided, fresh worker next time
            log.warning("math-verify worker failed: %s", exc)
            worker.kill()
            return None
        finally:
            if worker.proc.poll() is None:
                self._release(worker)
            else:
                self._start()

    def _start(self) -> None:
        """Start a worker for a slot in the background; it joins the pool once warmed up (or, when it
        cannot start, the empty slot comes back a second later, for the next caller to try again)."""

        def start() -> None:
            worker: _Worker | None = None
            try:
                worker = _Worker()
                with self._lock:
                    self._all.append(worker)
                if worker.read(time.monotonic() + START_LIMIT) != {"ready": True}:
                    raise OSError(f"no ready line within {START_LIMIT:.0f} s")
            except Exception as exc:
                log.warning("math-verify worker did not start: %s", exc)
                if worker is not None:
                    worker.kill()
                worker = None
                time.sleep(1.0)
            self._release(worker)

        threading.Thread(target=start, daemon=True, name="mentor-math-worker-start").start()

    def _acquire(self, deadline: float) -> _Worker | None:
        """A free slot, or the first one released after those of earlier callers; queue.Empty at `deadline`."""
        with self._slots:
            if self._free and not self._waiting:
                return self._free.pop()
            ticket = (threading.Event(), [])
            self._waiting.append(ticket)
        ticket[0].wait(max(0.0, deadline - time.monotonic()))
        with self._slots:
            if ticket[1]:
                return ticket[1][0]
            self._waiting.remove(ticket)
        raise queue.Empty

    def _release(self, worker: _Worker | None) -> None:
        with self._slots:
            if self._waiting:
                event, box = self._waiting.popleft()
                box.append(worker)
                event.set()
            else:
                self._free.append(worker)

    def close(self) -> None:
        with self._lock:
            for w in self._all:
                w.kill()
            self._all.clear()


_POOL: MathVerifierPool | None = None
_POOL_LOCK = threading.Lock()


def math_pool() -> MathVerifierPool:
    """The process-wide pool (a new one after fork; size/timeout from MENTOR_MATH_WORKERS / MENTOR_MATH_TIMEOUT)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = MathVerifierPool(
                size=int(os.environ.get("MENTOR_MATH_WORKERS", "2")),
                timeout=float(os.environ.get("MENTOR_MATH_TIMEOUT", "10")),
            )
        return _POOL


def verify_math(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals `reference` (math-verify), else 0.0."""
    if not reference or not isinstance(response, str):
        return 0.0
    answer = extract_math_answer(response)
    if answer is None:
        return 0.0
    if _norm(answer) == _norm(reference):
        return 1.0  # identical text: no need to parse
    why = explosive(answer)
    if why is not None:
        math_count(f"refused:{why.kind}")
        log.debug("math answer refused before math-verify (%s): %r", why, answer[:80])
        return 0.0
    return 1.0 if math_pool().check(reference, answer) else 0.0


# --------------------------------------------------------------------------- code (see code_verify)

# The keys of a code label (`schemas.code_label`); "setup" only in labels that carry one.
CODE_LABEL_KEYS = ("tests", "entry_point", "kind", "setup")


# --------------------------------------------------------------------------- dispatcher


def reference_of(label: dict) -> str | dict | None:
    """The domain-form reference inside a parsed prompt label (math answer or code tests dict)."""
    if label.get("domain") == "code":
        return {k: label.get(k) for k in CODE_LABEL_KEYS if k != "setup" or label.get(k) is not None}
    return label.get("answer")


def verify(domain: str, response: str, reference_label: str | dict | None) -> float:
    """Correctness in [0, 1] of `response` against the reference; 0.0 on anything undecidable.

    `reference_label` is the domain-form label: the math answer text, or for code
    the `code_label` JSON / dict. A full prompt label dict (with ``domain``) is
    accepted too.
    """
    try:
        if isinstance(reference_label, dict) and "domain" in reference_label:
            reference_label = reference_of(reference_label)
        if domain == "math":
            return verify_math(response, str(reference_label) if reference_label is not None else "")
        if domain == "code":
            if reference_label is None:
                return 0.0
            return verify_code(response, reference_label)
        log.warning("verify: unknown domain %r (expected math or code); scored 0", domain)
        return 0.0
    except Exception:
        log.exception("verify(%s) failed; scored 0", domain)
        return 0.0


__all__ = [
    "CODE_LABEL_KEYS",
    "CODE_PRELUDE",
    "CodeOutcome",
    "MATH_STATS",
    "MathVerifierPool",
    "extract_code",
    "extract_math_answer",
    "last_boxed",
    "math_pool",
    "run_code_tests",
    "verify",
    "verify_code",
    "verify_math",
]

if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
