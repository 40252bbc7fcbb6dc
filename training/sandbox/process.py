"""A message-passing sandbox (worker or tester): one JSON object per line each way, under a deadline."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time

from mentor.training.sandbox import backend, check_layers
from mentor.training.sandbox.launch import Launch, Running, poll_ready, start_sandbox
from mentor.training.sandbox.layers import SandboxLimits, identity_ok
from mentor.training.sandbox.pipes import Pacer
from mentor.training.sandbox.slots import Lease

log = logging.getLogger(__name__)


# The messages this process parses (hellos, "ready", the tester's verdict) are small; calls and replies,
# which may be large, are relayed as bytes and never parsed here (see `code_verify.run_humaneval`).
MAX_PARSED = 16 << 10


def _small_object(pairs: list) -> dict:
    """JSON objects in messages have a handful of distinct keys; others are refused before any dict is built."""
    if len(pairs) > 16:
        raise ValueError("a message object with more than 16 keys")
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a message object with a repeated key")
    return out


def _bounded_int(text: str) -> int:
    if len(text) > 4300:  # Python's own default limit; converting longer digit strings is quadratic
        raise ValueError("an integer of more than 4300 digits")
    return int(text)


def parse_message(line: bytes | str) -> dict | None:
    """One small message line (at most `MAX_PARSED` bytes) as a dict; None when it is not one.

    Linear in its length: JSON objects are kept small and their keys distinct (no hash table built
    from the sandbox's keys, no object that a later repeated key would replace) and, where this
    process turned Python's int-digit limit off, long integer literals are refused.
    """
    if len(line) > MAX_PARSED:
        return None
    try:
        limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # Python < 3.10.7 has no limit: treat it as off
        extra = {"parse_int": _bounded_int} if limit == 0 or limit > 4300 else {}
        obj = json.loads(line, object_pairs_hook=_small_object, **extra)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return obj if type(obj) is dict else None


class SandboxProcess:
    """A running worker/tester sandbox: JSON objects, one per line, each way, under a deadline.

    `recv` returns None (and sets `failure`) on a timeout, an exit, an
    oversized line or anything that is not one JSON object; the caller then
    treats the whole check as failed. `close` kills it and frees its slot.
    Its stderr is read only until the harness's hello (after that the harness
    points fd 2 at /dev/null, and this end is closed), and never past
    `SandboxLimits.max_output`.
    """

    def __init__(self, role: str, limits: SandboxLimits, deadline: float) -> None:
        self.role = role
        self.limits = limits
        self.failure: str | None = None
        self.layers: list[str] = []
        self.identity: dict = {}
        self._lease: Lease | None = None
        self._launch: Launch | None = None
        self.proc: subprocess.Popen | None = None
        self._running: Running | None = None
        be = backend()
        self.backend = be.name
        check_layers(be.layers, f" ({be.name} backend)")
        self._lease, self._launch, self._running = start_sandbox(be.impl, be.memcg, role, limits, deadline,
                                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                                 stderr=subprocess.PIPE)
        self.proc = self._running.proc
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._err = self.proc.stderr.fileno()  # type: ignore[union-attr]
        for f in (self._in, self._out, self._err):
            os.set_blocking(f, False)
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline
        self._pace_in, self._pace_out = Pacer(), Pacer()
        self.stderr = bytearray()
        self._err_open = True

    def _close_err(self) -> None:
        if self._err_open:
            self._err_open = False
            try:
                self.proc.stderr.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def _drain_err(self) -> None:
        try:
            chunk = os.read(self._err, 1 << 16)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            self._close_err()
            return
        self.stderr += chunk[: self.limits.max_output - len(self.stderr)]
        if len(self.stderr) >= self.limits.max_output:
            self._close_err()  # past the cap nothing more is read: a flood costs this process nothing

    def hello(self, deadline: float) -> bool:
        """Wait for the harness's hello; False (with `failure`) unless it runs as a non-root uid."""
        msg = self.recv(deadline)
        if msg is None:
            return False
        if not identity_ok(msg.get("hello")):
            self.failure = f"{self.role} sandbox is not running as an unprivileged uid ({msg.get('hello')!r:.100})"
            log.error("mentor sandbox: %s", self.failure)
            return False
        self.identity = msg["hello"]
        self.layers = [str(x) for x in msg.get("layers", [])] if isinstance(msg.get("layers"), list) else []
        self._close_err()  # from here on the harness writes nothing there (fd 2 is /dev/null inside)
        return True

    def send(self, obj: dict, deadline: float) -> bool:
        return self.send_line((json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode(), deadline)

    def send_line(self, data: bytes, deadline: float) -> bool:
        """Write `data` (one line, its newline included) before the deadline; False with `failure` if not."""
        view, sent = memoryview(data), 0
        while sent < len(data):
            left = deadline - time.monotonic()
            if left <= 0:
                self.failure = "timeout"
                return False
            rl = [self._err] if self._err_open else []
            r, w = poll_ready(rl, [self._in], left)
            if r:
                self._drain_err()
            if w:
                try:
                    n = os.write(self._in, view[sent:])
                except BlockingIOError:
                    continue
                except OSError:  # it exited (EPIPE)
                    self.failure = "exited"
                    return False
                sent += n
                if sent < len(data):
                    self._pace_out.after(n, deadline)  # a sandbox that reads a byte at a time is written to in large chunks
        return True

    def recv_line(self, deadline: float) -> bytes | None:
        """The next line as bytes, without its newline (at most `SandboxLimits.max_message`); None with
        `failure` on a timeout, an exit or an oversized line. Linear: each byte is scanned once; a line that
        trickles in is read in large chunks (`pipes.Pacer`), never a wake per byte."""
        while True:
            nl = self._buf.find(b"\n", self._scanned)
            if nl >= 0:
                break
            self._scanned = len(self._buf)
            if len(self._buf) > self.limits.max_message:
                self.failure = "oversized message"
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                self.failure = "timeout"
                return None
            rl = [self._out] + ([self._err] if self._err_open else [])
            r, _ = poll_ready(rl, [], left)
            if self._err_open and self._err in r:
                self._drain_err()
            if self._out in r:
                try:
                    chunk = os.read(self._out, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    self.failure = "exited"
                    return None
                self._buf += chunk
                if b"\n" not in chunk:
                    self._pace_in.after(len(chunk), deadline)  # a line that trickles in is read in large chunks
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]
        self._scanned = 0
        if len(line) > self.limits.max_message:
            self.failure = "oversized message"
            return None
        return line

    def recv(self, deadline: float) -> dict | None:
        """The next line as a small message (`parse_message`); None with `failure` when it is not one."""
        line = self.recv_line(deadline)
        if line is None:
            return None
        obj = parse_message(line)
        if obj is None:
            self.failure = "malformed message"
        return obj

    def close(self) -> None:
        if self._running is not None and self.proc is not None:
            self._running.end()
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except Exception:
                    pass
            self.proc = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        for d in self._launch.cleanup if self._launch else ():
            shutil.rmtree(d, ignore_errors=True)
        self._launch = None

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
