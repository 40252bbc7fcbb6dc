"""What one sandbox holds while it runs: a slot uid of its own (as root) and its memory cgroup.

As root, each running sandbox gets a uid of its own from
``MENTOR_SANDBOX_UID_BASE`` (1900000000) + 0..``MENTOR_SANDBOX_SLOTS`` (128),
held with an flock on ``/run/mentor-sandbox/slot-N`` (shared by every process
on the machine) for as long as the sandbox lives. A real uid of its own makes
root-only files unreadable and makes RLIMIT_NPROC count only that sandbox's
processes (it counts every process of a uid system-wide, so sandboxes sharing
``nobody`` would starve each other). The worker and the tester of one check
have different uids.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import random
import tempfile
import threading
import time

from mentor.training.sandbox.cgroups import MemCgroups
from mentor.training.sandbox.layers import SandboxLimits, SandboxUnavailable

log = logging.getLogger(__name__)

UID_BASE = int(os.environ.get("MENTOR_SANDBOX_UID_BASE", "1900000000"))
SLOTS = int(os.environ.get("MENTOR_SANDBOX_SLOTS", "128"))


class Slots:
    """Per-sandbox uids, held with an flock so that every process on the machine agrees."""

    def __init__(self) -> None:
        self._dir: str | None = None
        self._lock = threading.Lock()

    def _lockdir(self) -> str:
        with self._lock:
            if self._dir is None:
                for base in ("/run", tempfile.gettempdir()):
                    d = os.path.join(base, "mentor-sandbox")
                    try:
                        os.mkdir(d, 0o700)
                    except FileExistsError:
                        pass
                    except OSError:
                        continue
                    st = os.lstat(d)
                    # Someone else's directory (or a symlink) could hand out slots that are in use.
                    if os.path.isdir(d) and not os.path.islink(d) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                        self._dir = d
                        break
                else:
                    raise SandboxUnavailable("no private directory for sandbox slot locks (/run/mentor-sandbox)")
            return self._dir

    def acquire(self, deadline: float) -> tuple[int, int]:
        """(uid, lock fd); waits for a free slot until `deadline`."""
        d = self._lockdir()
        delay = 0.002
        while True:
            start = random.randrange(SLOTS)
            for i in range(SLOTS):
                n = (start + i) % SLOTS
                fd = os.open(os.path.join(d, f"slot-{n}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return UID_BASE + n, fd
                except BlockingIOError:
                    os.close(fd)
            if time.monotonic() > deadline:
                raise SandboxUnavailable(f"all {SLOTS} sandbox slots are busy (MENTOR_SANDBOX_SLOTS)")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    @staticmethod
    def release(fd: int | None) -> None:
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


SLOT_LOCKS = Slots()
_RUN_IDS = itertools.count()


class Lease:
    """What one sandbox holds while it runs: a slot uid and its lock (as root), and its memory cgroup."""

    def __init__(self, root: bool, memcg: MemCgroups | None, limits: SandboxLimits, deadline: float) -> None:
        self.uid: int | None = None
        self.fd: int | None = None
        self.memcg = memcg
        self.procs: str | None = None
        if root:
            self.uid, self.fd = SLOT_LOCKS.acquire(deadline)
            self.name = f"slot-{self.uid - UID_BASE}"
        else:
            self.name = f"run-{os.getpid()}-{next(_RUN_IDS)}"
        if memcg is not None:
            try:
                self.procs = memcg.enter(self.name, limits.group_bytes)
            except OSError as exc:
                self.release()
                raise SandboxUnavailable(f"mentor sandbox: memory cgroup {memcg.base}/{self.name}: {exc}") from exc

    def release(self) -> None:
        if self.memcg is not None:
            if self.procs is not None and not self.memcg.drain(self.name):
                log.warning("mentor sandbox: processes still in %s/%s 5 s after the run", self.memcg.base, self.name)
            self.memcg.leave(self.name)
        SLOT_LOCKS.release(self.fd)
        self.fd = None
