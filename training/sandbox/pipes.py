"""A sandbox's pipes as the trusted process serves them: a deadline, a byte budget, and no wake per byte.

A sandbox decides how its bytes arrive: one at a time, for seconds, if it likes. Woken for every
read that poll allows, the trusted process (OpenRLHF's engine process, holding the GIL while it runs
Python) paid about 1.5 s of CPU for a worker that wrote its reply one byte at a time (issue 58; a
wake costs it 50-200 us of CPU on a loaded host). So every pipe here is read (or written) in large
chunks: a channel's first `FREE` transfers smaller than `BIG` are free, and after each later one the
caller sleeps `PAUSE` before it polls that sandbox again, so the bytes pile up in the pipe meanwhile
(64 KiB of buffer). A wake then moves either at least `BIG` bytes (bounded by the byte budget) or
whatever came in `PAUSE` (bounded by the deadline: at most 1 / `PAUSE` wakes a second, 200 in a
10-second run). An ordinary message arrives whole in one read and pays nothing, and an ordinary
program's output in a few reads.

`run_program` serves a ``program`` sandbox's stdio (`sandbox.run_python`): its input is written to a
pipe and its output read from pipes, so nothing of the host's disk is handed to the program (a file
on fd 1 could be grown with ``fallocate`` past the file-size limit, which that call does not check).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from mentor.training.sandbox.launch import poll_ready

BIG = 16 << 10  # a transfer at least this large is followed by the next one at once
FREE = 16  # small transfers a channel makes before it is paced
PAUSE = 0.05  # after that, the sandbox's next bytes are waited for this long


class Pacer:
    """The pace of one channel: call `after` with the bytes each wake moved."""

    def __init__(self) -> None:
        self.small = 0

    def after(self, moved: int, deadline: float) -> None:
        """Sleep `PAUSE` (never past the deadline) after a transfer smaller than `BIG`, once `FREE` are used."""
        if moved >= BIG:
            return
        self.small += 1
        if self.small > FREE:
            left = deadline - time.monotonic()
            if left > 0:
                time.sleep(min(PAUSE, left))


@dataclass
class ProgramOutput:
    stdout: bytes  # at most `keep_out` + 1 bytes: more than `keep_out` means truncated
    stderr: bytes  # at most `keep_err` + 1 bytes
    timed_out: bool  # the deadline came before the program closed its output


def run_program(proc, stdin: bytes, deadline: float, keep_out: int, keep_err: int, most: int) -> ProgramOutput:
    """Feed `stdin` to `proc` (a Popen with three pipes) and collect its stdout and stderr until both end (or
    `proc` has ended and they stay quiet for a quarter of a second) or the deadline passes. Of each stream the first `keep_*` + 1 bytes are kept and the rest read and dropped;
    past `most` bytes (the file-size limit its output files had) a stream's read end is closed, and the
    program's next write there fails (SIGPIPE), as a write past the file-size limit did."""
    fin, fout, ferr = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    for fd in (fin, fout, ferr):
        os.set_blocking(fd, False)
    keep = {fout: keep_out + 1, ferr: keep_err + 1}
    got = {fout: bytearray(), ferr: bytearray()}
    seen = {fout: 0, ferr: 0}
    readers = [fout, ferr]
    data, sent = memoryview(stdin), 0
    writer = fin if stdin else None
    if writer is None:
        proc.stdin.close()
    timed_out, pacer = False, Pacer()
    try:
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            r, w = poll_ready(readers, [writer] if writer is not None else [], min(left, 0.25))
            if not r and not w and proc.poll() is not None:
                break  # it ended, and what still holds its output open is a leftover (the caller kills it)
            moved = 0
            if writer is not None and writer in w:
                try:
                    n = os.write(writer, data[sent:sent + (1 << 16)])
                    sent, moved = sent + n, moved + n
                except BlockingIOError:
                    pass
                except OSError:  # it closed its stdin or exited (EPIPE)
                    sent = len(data)
                if sent >= len(data):
                    proc.stdin.close()
                    writer = None
            for fd in r:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    readers.remove(fd)
                    continue
                moved += len(chunk)
                seen[fd] += len(chunk)
                room = keep[fd] - len(got[fd])
                if room > 0:
                    got[fd] += chunk[:room]
                if seen[fd] > most:
                    readers.remove(fd)
                    (proc.stdout if fd == fout else proc.stderr).close()
            if readers:
                pacer.after(moved, deadline)
    finally:
        if writer is not None:
            proc.stdin.close()
    return ProgramOutput(bytes(got[fout]), bytes(got[ferr]), timed_out)
