"""Run untrusted Python (model-written code) in a contained child process.

Used by the code verifier (`mentor.training.code_verify`): HumanEval-style
tests run as two sandboxes, a *worker* holding the candidate's code and a
*tester* holding the tests, which only exchange plain data through the caller
(see that module for the pass protocol); stdin/stdout cases run as one
*program* sandbox each (`run_python`). The code inside every sandbox is
`sandbox_harness` (plus `plaincodec`); docs/sandbox.md has the threat model.

Backends
--------
``bwrap`` (the default where it works): bubblewrap builds the sandbox from
nothing: new PID, network, IPC, UTS and cgroup namespaces; a root filesystem
that holds only ``/usr`` (and its ``/bin``, ``/lib`` links), the interpreter's
prefix (its ``site-packages`` covered by an empty tmpfs), a private ``/proc``
and minimal ``/dev``, all read-only, plus an empty size-limited tmpfs ``/tmp``
as the work dir; ``--die-with-parent``, ``--new-session``, a clean environment.
Started as root, bwrap keeps only CAP_SETUID/SETGID/SETPCAP for ``setpriv``
(and, without a memory cgroup, CAP_SYS_ADMIN for ``mount(8)``, which first
mounts /tmp with a size *and* an inode limit), which empties the bounding set, sets no_new_privs and switches
real, effective and saved uid/gid to the run's own *slot uid* before exec'ing
the interpreter (no capabilities are left). bwrap loads the syscall filter
(`seccomp_filter`, on ``--seccomp FD``) before it execs anything, and covers
/proc's cross-uid views (/proc/key-users, /proc/keys, /proc/locks) with an empty
file. The launcher enters the sandbox's memory cgroup (`MemCgroups`) before
exec'ing bwrap. The interpreter's prefix is bind-mounted at its own
path into that fresh root, whose directories (``/root`` included) are 0755,
so a pyenv Python under /root (0700 on the host) runs as the slot uid while
nothing else of /root exists inside. Started as a normal user, bwrap uses a
user namespace and the code keeps the user's own (unprivileged) uid.

``legacy`` (no bubblewrap, or it cannot create namespaces here): the previous
hand-written layers, see `sandbox_legacy`: unshare(2) namespaces, the whole
filesystem remounted read-only except the work dir, the interpreter exposed to
the slot uid, the same syscall filter and memory cgroup, an audit-hook
tripwire. It lacks ``fsview`` and ``tmpcap``: the code can read
world-readable files. Used with a warning; ``MENTOR_SANDBOX=bwrap|legacy``
forces a backend.

Slot uids
---------
As root, each running sandbox gets a uid of its own from
``MENTOR_SANDBOX_UID_BASE`` (1900000000) + 0..``MENTOR_SANDBOX_SLOTS`` (128),
held with an flock on ``/run/mentor-sandbox/slot-N`` (shared by every process
on the machine) for as long as the sandbox lives. A real uid of its own makes
root-only files unreadable and makes RLIMIT_NPROC count only that sandbox's
processes (it counts every process of a uid system-wide, so sandboxes sharing
``nobody`` would starve each other). The worker and the tester of one check
have different uids.

Layers
------
Each run reports the layers in force (`SandboxResult.layers`, and the
``hello`` of worker/tester): ``process`` (a separate ``python -I -S -B``),
``env`` (clean environment), ``fsview`` (only interpreter and system files
visible, read-only), ``fsro`` (legacy: everything read-only), ``netns``,
``pidns``, ``procns`` (a private /proc, its cross-uid views such as
/proc/key-users masked), ``uid`` (a real non-zero uid), ``nocaps`` (no
capabilities, no_new_privs), ``rlimits`` (CPU, address space, file size,
processes, open files, no core), ``nproc`` (PID namespace + RLIMIT_NPROC of a
uid of its own: a fork bomb is bounded whatever the uid), ``timeout`` (wall
clock kill), ``seccomp`` (a syscall filter: no kernel keyrings, file locks,
inotify/fanotify, memfd or SysV IPC, io_uring, bpf, perf events,
userfaultfd, and no new user namespace), ``memcg`` (a memory cgroup of its
own: ``memory.max`` with swap off on cgroup v2, ``memory.limit_in_bytes`` +
``memsw`` on v1; kernel memory such as tmpfs inodes is charged to it),
``tmpcap`` (where there is no memory cgroup: /tmp limited in inodes as well as
bytes; `MEMCG_FALLBACK`), ``audit`` (legacy tripwire, never required). When one of
`REQUIRED_LAYERS` is missing, a warning naming it is logged once per process;
with ``MENTOR_SANDBOX_STRICT=1`` the run refuses instead (`SandboxUnavailable`).
Whatever the backend, code never runs as uid 0: the harness checks its own
identity before any untrusted code runs and exits if it is root.

Guarantees (bwrap, defaults): the code cannot outlive the wall-clock limit or
its CPU limit, allocate more than the address-space limit per process or the
memory cgroup's limit in all, start more processes than
`SandboxLimits.processes` (1 for worker and tester: no fork, no threads),
reach any network, see other processes, read the caller's environment or any
file outside /usr and the interpreter's standard library, write anything but
its tmpfs, keep processes or any other state (keys, files, locks) after the
run, or signal another sandbox through a lock or a watch on a shared file. Not
guaranteed: protection from kernel exploits (it shares the host kernel) and
from CPU/memory-bandwidth contention and timing side channels. For hostile
workloads at scale run the verifier behind a VM/container sandbox service (see
`code_verify`'s runner seam).
"""

from __future__ import annotations

import binascii
import fcntl
import itertools
import json
import logging
import marshal
import os
import platform
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
REQUIRED_LAYERS = ("process", "env", "fsview", "netns", "pidns", "procns", "uid", "nocaps", "rlimits", "nproc", "timeout",
                   "seccomp", "memcg")
# Where `memcg` is missing, these stand in for it (and are named as missing too when they are not there).
MEMCG_FALLBACK = ("tmpcap",)
# What a missing layer means, as the warning says it.
LAYER_MEANING = {
    "process": "the code does not run in a separate isolated interpreter",
    "env": "the code sees the caller's environment variables",
    "fsview": "the code can read every world-readable file, datasets and their tests included",
    "netns": "the code can reach the network",
    "pidns": "the code can see other processes and leave processes behind",
    "procns": "the code can see other processes, or other uids' key quotas, in /proc",
    "uid": "the code does not run as an unprivileged uid of its own",
    "nocaps": "the code keeps capabilities",
    "rlimits": "its CPU, memory, file-size and process limits are not all set",
    "nproc": "it has no process limit of its own: a fork bomb is bounded only by the wall-clock kill",
    "timeout": "it has no wall-clock limit",
    "seccomp": "the code can use kernel keyrings, file locks, inotify, memfd/SysV shared memory and new user namespaces: "
               "state that outlives the run, signals between concurrent sandboxes, memory outside its limits",
    "memcg": "no memory cgroup bounds the sandbox as a whole: memory outside the address-space limit (page cache, pipes, "
             "kernel objects) is bounded only by the per-process limits, the syscall filter and the /tmp caps",
    "tmpcap": "its writable /tmp has no inode limit (and no memory cgroup charges its inodes): empty files can fill "
              "the host's kernel memory",
}
UID_BASE = int(os.environ.get("MENTOR_SANDBOX_UID_BASE", "1900000000"))
SLOTS = int(os.environ.get("MENTOR_SANDBOX_SLOTS", "128"))
_MARK = "\x00MENTOR-SANDBOX-LAYERS "


class SandboxUnavailable(RuntimeError):
    """A required layer cannot be had here and MENTOR_SANDBOX_STRICT=1 is set (or no uid can be dropped to)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # address space per process; CPython itself needs ~30 MiB
    file_bytes: int = 16 << 20  # largest file (also stdout/stderr) it may write
    processes: int = 4  # RLIMIT_NPROC of its own uid: processes + threads (worker/tester use 1)
    open_files: int = 64
    tmp_bytes: int = 16 << 20  # size of its writable /tmp (bwrap)
    tmp_inodes: int = 4096  # files and directories its /tmp may hold (bwrap, `tmpcap`)
    cgroup_bytes: int | None = None  # memory cgroup limit for the whole sandbox; None: memory_bytes + tmp_bytes + 64 MiB
    max_output: int = 64 << 10  # bytes of stdout/stderr kept
    max_message: int = 4 << 20  # largest worker/tester message
    namespaces: bool = True  # legacy backend: try namespaces
    audit: bool = True  # legacy backend: the audit-hook tripwire

    @property
    def group_bytes(self) -> int:
        return int(self.cgroup_bytes) if self.cgroup_bytes else int(self.memory_bytes + self.tmp_bytes + (64 << 20))


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed by the wall-clock timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration: float
    layers: list[str] = field(default_factory=list)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    backend: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# --------------------------------------------------------------------------- interpreter


@dataclass(frozen=True)
class Interpreter:
    exe: str  # real path of the binary
    prefix: str  # its installation prefix (stdlib under prefix/lib/pythonX.Y)
    site_packages: tuple[str, ...]  # hidden inside the sandbox


@lru_cache(maxsize=1)
def interpreter() -> Interpreter:
    """The interpreter sandboxes run: this one's base (not a venv), or MENTOR_SANDBOX_PYTHON."""
    override = os.environ.get("MENTOR_SANDBOX_PYTHON")
    if override:
        exe = os.path.realpath(shutil.which(override) or override)
        out = subprocess.run([exe, "-I", "-S", "-c", "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")
        prefix, site = out[0], (out[1],)
    else:
        import sysconfig

        exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        prefix = sys.base_prefix
        site = tuple({sysconfig.get_path("purelib", vars={"base": prefix}), sysconfig.get_path("platlib", vars={"platbase": prefix})})
    return Interpreter(exe, os.path.realpath(prefix), tuple(os.path.realpath(s) for s in site))


def _world_usable(path: str) -> bool:
    """Whether a uid that owns nothing can reach `path` (every parent directory searchable) and read it."""
    try:
        p = Path(path).resolve()
        if not all(q.stat().st_mode & 0o001 for q in p.parents):
            return False
        mode = p.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o004) and (not p.is_dir() or bool(mode & 0o001))


def _source(*names: str) -> str:
    return "\n".join((HERE / n).read_text(encoding="utf-8") for n in names) + "\nmain()\n"


@lru_cache(maxsize=2)
def harness_source(legacy: bool) -> str:
    return _source("plaincodec.py", *(("sandbox_legacy.py",) if legacy else ()), "sandbox_harness.py")


_LOADER = "import binascii, marshal, sys; exec(marshal.loads(binascii.a2b_base64(sys.argv.pop(1))))"


@lru_cache(maxsize=2)
def harness_args(legacy: bool) -> tuple[str, ...]:
    """What follows ``python -I -S -B`` to run the harness: ``-c SOURCE``, or, when the sandbox runs this
    very interpreter, its code object compiled once here and marshalled (this interpreter's format), which
    saves every sandbox compiling 27 KB of source (about 5 ms of its CPU; unmarshalling takes 0.2 ms)."""
    src = harness_source(legacy)
    if os.environ.get("MENTOR_SANDBOX_PYTHON") or interpreter().exe != os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable):
        return ("-c", src)
    blob = binascii.b2a_base64(marshal.dumps(compile(src, "<string>", "exec")), newline=False).decode()
    if len(blob) > 100_000:  # one argument may hold at most 128 KiB (MAX_ARG_STRLEN)
        return ("-c", src)
    return ("-c", _LOADER, blob)


# --------------------------------------------------------------------------- seccomp

# The syscalls a sandbox never needs and that hold state beyond the run, open a channel to another
# sandbox, or hold memory outside RLIMIT_AS: kernel keyrings (the slot uid's user keyring outlives
# the run), flock/fcntl locks and inotify/fanotify watches (on the read-only files every sandbox
# shares), memfd and SysV shared memory (pages outside the address space), io_uring, bpf,
# perf_event_open and userfaultfd (attack surface); plus new user namespaces (a tmpfs of its own,
# keyrings of its own) and clone3, whose flags sit in memory a filter cannot read (ENOSYS: glibc
# falls back to clone, whose flags it checks).
_SYSCALLS = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "flock": 73, "inotify_init": 253, "inotify_add_watch": 254,
        "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301, "memfd_create": 319, "memfd_secret": 447,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 323, "perf_event_open": 298, "bpf": 321,
        "fcntl": 72, "unshare": 272, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "flock": 32, "inotify_init1": 26, "inotify_add_watch": 27,
        "fanotify_init": 262, "fanotify_mark": 263, "memfd_create": 279, "memfd_secret": 447,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "perf_event_open": 241, "bpf": 280,
        "fcntl": 25, "unshare": 97, "clone": 220, "clone3": 435}),
}
_SPECIAL = ("fcntl", "unshare", "clone", "clone3")
# fcntl commands that take, test or watch a lock or lease: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK,
# F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY.
_LOCK_CMDS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
_CLONE_NEWUSER = 0x10000000


def syscall_numbers() -> dict[str, int]:
    """This machine's numbers of the filtered syscalls ({} where the filter is not available)."""
    return dict(_SYSCALLS.get(platform.machine(), (0, {}))[1])


@lru_cache(maxsize=1)
def seccomp_filter() -> bytes | None:
    """The classic-BPF program (``struct sock_filter[]``, as ``bwrap --seccomp`` reads it); None on other CPUs."""
    if platform.machine() not in _SYSCALLS or sys.byteorder != "little":
        return None
    arch, nr = _SYSCALLS[platform.machine()]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    allow, errno = 0x7FFF0000, 0x00050000
    prog: list[list] = []  # [code, jump-if-true label, jump-if-false label, k]

    def op(code: int, k: int = 0, yes: str | None = None) -> None:
        prog.append([code, yes, None, k])

    op(ld, 4)  # seccomp_data.arch
    prog.append([jeq, None, "enosys", arch])  # another ABI (i386 on x86_64): nothing
    op(ld, 0)  # seccomp_data.nr
    if arch == 0xC000003E:
        op(jge, 0x40000000, "enosys")  # the x32 ABI
    for name, n in nr.items():
        if name not in _SPECIAL:
            op(jeq, n, "eperm")
    op(jeq, nr["clone3"], "enosys")
    op(jeq, nr["fcntl"], "fcntl")
    op(jeq, nr["unshare"], "userns")
    op(jeq, nr["clone"], "userns")
    op(ret, allow)
    labels = {"fcntl": len(prog)}
    op(ld, 24)  # low word of args[1]: the command
    for cmd in _LOCK_CMDS:
        op(jeq, cmd, "eperm")
    op(ret, allow)
    labels["userns"] = len(prog)
    op(ld, 16)  # low word of args[0]: the flags of unshare and clone
    op(jset, _CLONE_NEWUSER, "eperm")
    op(ret, allow)
    labels["eperm"] = len(prog)
    op(ret, errno | 1)  # EPERM
    labels["enosys"] = len(prog)
    op(ret, errno | 38)  # ENOSYS
    out = bytearray()
    for i, (code, yes, no, k) in enumerate(prog):
        jt, jf = ((labels[x] - i - 1) if x else 0 for x in (yes, no))
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("=HBBI", code, jt, jf, k)
    return bytes(out)


# --------------------------------------------------------------------------- memory cgroups


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of each mount of this process."""
    out = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                f, r = left.split(), right.split()
                if len(f) >= 5 and len(r) >= 3:
                    point = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), f[4])
                    out.append((f[3], point, r[0], set(r[2].split(","))))
    except OSError:
        pass
    return out


def _own_cgroups() -> dict[str, str]:
    """{"v2": path} and/or {"v1": path of the memory hierarchy} from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                num, _, rest = line.strip().partition(":")
                ctrls, _, path = rest.partition(":")
                if num == "0" and ctrls == "":
                    out["v2"] = path
                elif "memory" in ctrls.split(","):
                    out["v1"] = path
    except OSError:
        pass
    return out


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


class MemCgroups:
    """One memory cgroup per running sandbox (bubblewrap does no cgroups).

    cgroup v2: ``BASE/slot-N`` with ``memory.max``, ``memory.swap.max = 0`` and
    ``memory.oom.group = 1`` (an OOM kills the whole sandbox), where BASE is a
    ``mentor-sandbox`` directory beside this process's own cgroup or at the top of the
    hierarchy, wherever ``memory`` is enabled for children and this process may create
    one. cgroup v1 (the memory controller on a v1 hierarchy, as on hybrid hosts):
    ``OWN/mentor-sandbox/slot-N`` with ``memory.limit_in_bytes`` and
    ``memory.memsw.limit_in_bytes`` (no swap beyond the limit). Kernel memory (tmpfs
    pages and inodes, pipes, page tables) is charged to it in both.
    ``MENTOR_SANDBOX_CGROUP=DIR`` names the base (a delegated cgroup of your own);
    ``=off`` turns the layer off. A sandbox enters its cgroup before bwrap starts
    (``sh -c 'echo 0 > cgroup.procs; exec bwrap ...'``), so all it runs is charged.
    """

    def __init__(self, base: str, version: str) -> None:
        self.base = base
        self.version = version
        self._set: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def discover() -> tuple[MemCgroups | None, str]:
        """(the cgroups, "") or (None, why not)."""
        want = os.environ.get("MENTOR_SANDBOX_CGROUP", "")
        if want.lower() in ("0", "off", "no", "none", "false"):
            return None, "turned off (MENTOR_SANDBOX_CGROUP=off)"
        mounts, own = _mountinfo(), _own_cgroups()
        v2 = next(((root, point) for root, point, fstype, _ in mounts if fstype == "cgroup2"), None)
        v1 = next(((root, point) for root, point, fstype, opts in mounts if fstype == "cgroup" and "memory" in opts), None)
        tried: list[str] = []
        candidates: list[tuple[str, str]] = []
        if want:
            candidates.append((want, "v2" if os.path.exists(os.path.join(want, "cgroup.controllers"))
                               or os.path.exists(os.path.join(os.path.dirname(want), "cgroup.controllers")) else "v1"))
        else:
            if v2 is not None and "v2" in own:
                point = v2[1]
                here = os.path.normpath(point + "/" + os.path.relpath(own["v2"], v2[0] if v2[0] != "/" else "/"))
                for parent in dict.fromkeys([os.path.dirname(here) if here != point else point, point]):
                    if parent.startswith(point):
                        candidates.append((os.path.join(parent, "mentor-sandbox"), "v2"))
            if v1 is not None and "v1" in own:
                point = v1[1]
                here = os.path.normpath(point + "/" + os.path.relpath(own["v1"], v1[0] if v1[0] != "/" else "/"))
                candidates.append((os.path.join(here, "mentor-sandbox"), "v1"))
        if not candidates:
            return None, ("no cgroup hierarchy with the memory controller is mounted here" if v2 is None and v1 is None
                          else "this process's memory cgroup could not be found in /proc/self/cgroup")
        for base, version in candidates:
            try:
                if version == "v2":
                    parent = os.path.dirname(base)
                    if not want and "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
                        tried.append(f"{parent}: memory is not enabled for its children")
                        continue
                os.makedirs(base, exist_ok=True)
                if not os.access(base, os.W_OK | os.X_OK):
                    raise PermissionError(13, "Permission denied")
                if version == "v2":
                    if "memory" not in _read(os.path.join(base, "cgroup.subtree_control")).split():
                        _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
                else:
                    if not os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
                        raise OSError(f"{base} is not a v1 memory cgroup")
                return MemCgroups(base, version), ""
            except OSError as exc:
                tried.append(f"{base}: {exc.strerror or exc}")
        return None, "no memory cgroup can be created here (" + "; ".join(tried)[:400] + "); set MENTOR_SANDBOX_CGROUP to a delegated cgroup"

    def enter(self, name: str, limit: int) -> str:
        """Make ``BASE/name`` with this limit (once per limit); the path of its cgroup.procs. OSError when it cannot."""
        d = os.path.join(self.base, name)
        with self._lock:
            if self._set.get(d) == limit:
                return os.path.join(d, "cgroup.procs")
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
            if self.version == "v2":
                for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1"), ("memory.max", str(limit))):
                    if knob == "memory.max" or os.path.exists(os.path.join(d, knob)):
                        _write(os.path.join(d, knob), value)
            else:
                memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
                old = int(_read(os.path.join(d, "memory.limit_in_bytes")))
                # memsw must stay >= the memory limit: raise it first when growing, after when shrinking.
                order = [memsw, os.path.join(d, "memory.limit_in_bytes")] if limit > old else [os.path.join(d, "memory.limit_in_bytes"), memsw]
                for f in order:
                    if os.path.exists(f):
                        _write(f, str(limit))
            self._set[d] = limit
        return os.path.join(d, "cgroup.procs")

    def reset_peak(self, name: str) -> None:
        if self.version == "v1":
            try:
                _write(os.path.join(self.base, name, "memory.max_usage_in_bytes"), "0")
            except OSError:
                pass

    def peak(self, name: str) -> int | None:
        """The most memory charged to it (v1 max_usage_in_bytes, v2 memory.peak); None when unknown."""
        f = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        try:
            return int(_read(os.path.join(self.base, name, f)).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def drain(self, name: str, timeout: float = 5.0) -> bool:
        """Wait until no process is left in ``BASE/name``: bwrap's monitor exits as soon as the sandbox's
        init reports the exit status, while that init may still be tearing its namespaces down (freeing a
        tmpfs of 60,000 inodes takes half a second), charged to this cgroup. True when it is empty."""
        procs = os.path.join(self.base, name, "cgroup.procs")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if not _read(procs).split():
                    return True
            except OSError:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def leave(self, name: str) -> None:
        """Per-run cgroups (not root: no slots) are removed; slot cgroups are kept for the next run."""
        if name.startswith("run-"):
            with self._lock:
                self._set.pop(os.path.join(self.base, name), None)
            try:
                os.rmdir(os.path.join(self.base, name))
            except OSError:
                pass


# --------------------------------------------------------------------------- slot uids


class _Slots:
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

    def empty_file(self) -> str:
        """An empty read-only file of ours, bind-mounted over /proc files a sandbox must not read."""
        path = os.path.join(self._lockdir(), "empty")
        try:
            st = os.lstat(path)
            if st.st_size == 0 and not os.path.islink(path) and st.st_uid == os.geteuid():
                return path
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path + f".{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
        os.close(fd)
        os.replace(path + f".{os.getpid()}", path)
        return path

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


_SLOTS = _Slots()
_RUN_IDS = itertools.count()


class _Lease:
    """What one sandbox holds while it runs: a slot uid and its lock (as root), and its memory cgroup."""

    def __init__(self, root: bool, memcg: MemCgroups | None, limits: SandboxLimits, deadline: float) -> None:
        self.uid: int | None = None
        self.fd: int | None = None
        self.memcg = memcg
        self.procs: str | None = None
        if root:
            self.uid, self.fd = _SLOTS.acquire(deadline)
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
        _SLOTS.release(self.fd)
        self.fd = None


# --------------------------------------------------------------------------- backends


def _clean_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }


@dataclass
class _Launch:
    argv: list[str]
    env: dict[str, str] | None
    cwd: str | None
    cleanup: list[str]  # host directories to remove afterwards
    info_fd: bool = False  # bwrap: report the sandbox init's pid on --info-fd
    pidns_waiter: bool = False  # legacy with a PID namespace: the child waits for the sandbox's init
    seccomp: bytes | None = None  # bwrap: the filter, handed over on --seccomp FD
    cgroup_procs: str | None = None  # the memory cgroup the launcher enters before it starts anything


# /proc files that show other uids' state through a private /proc (key quotas of every uid, locks).
_PROC_MASKS = ("/proc/key-users", "/proc/keys", "/proc/locks")


class _Bwrap:
    name = "bwrap"
    layers = ("process", "env", "fsview", "netns", "pidns", "procns", "uid", "nocaps", "timeout", "nproc")

    def __init__(self, path: str) -> None:
        self.path = path
        self.root = os.geteuid() == 0
        self.sh = shutil.which("sh", path="/usr/bin:/bin")
        # As root, /tmp is mounted inside by mount(8) with an inode limit (bwrap's --tmpfs only takes a size).
        self.mount = shutil.which("mount", path="/usr/bin:/bin") if self.root else None

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None, extra: tuple[str, ...] = ()) -> _Launch:
        interp = interpreter()
        argv = [self.path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session"]
        if not self.root:
            argv += ["--unshare-user", "--disable-userns"]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = "/" + top
            if os.path.islink(p):
                argv += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                argv += ["--ro-bind", p, p]
        if os.path.exists("/etc/ld.so.cache"):
            argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        for path in {interp.prefix, interp.exe} if not interp.exe.startswith(interp.prefix + "/") else {interp.prefix}:
            if path.startswith("/usr/"):
                continue
            # Its parents are created 0755 first (bwrap would copy /root's 0700), so the slot uid can reach it.
            for parent in reversed(Path(path).parents[:-1]):
                argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", path, path]
        for site in interp.site_packages:
            if os.path.isdir(site):
                argv += ["--tmpfs", site]  # its standard library only: no installed packages, no project code
        argv += ["--proc", "/proc", "--dev", "/dev"]
        empty = _SLOTS.empty_file()
        for p in _PROC_MASKS:
            if os.path.exists(p):
                argv += ["--ro-bind", empty, p]
        tmp_opts = f"size={int(limits.tmp_bytes)},nr_inodes={int(limits.tmp_inodes)},mode=1777,nosuid,nodev"
        # In a memory cgroup, inodes and dentries are charged to the sandbox like any memory; without one
        # (as root) /tmp gets an inode limit of its own, from mount(8) inside.
        prestep = bool(self.mount and self.sh) and "memcg" not in extra
        if prestep:
            argv += ["--perms", "1777", "--dir", "/tmp"]
        else:
            argv += ["--perms", "1777", "--size", str(int(limits.tmp_bytes)), "--tmpfs", "/tmp"]
        if program is not None:
            argv += ["--perms", "0755", "--dir", "/sandbox", "--ro-bind", program, "/sandbox/main.py"]
            cfg["main"] = "/sandbox/main.py"
        argv += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in _clean_env("/tmp").items():
            argv += ["--setenv", k, v]
        layers = list(self.layers) + list(extra)
        if self.root:
            caps = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"] + (["CAP_SYS_ADMIN"] if prestep else [])
            for cap in caps:
                argv += ["--cap-add", cap]
            argv += ["--"]
            if prestep:
                # Mounted by trusted binaries before setpriv drops every capability and the uid.
                argv += [self.sh, "-c", f'{self.mount} -t tmpfs -o "$0" tmpfs /tmp && cd /tmp && exec "$@"', tmp_opts]
                layers.append("tmpcap")
            argv += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        else:
            argv += ["--"]
        prog = seccomp_filter()
        if prog is not None:
            layers.append("seccomp")
        cfg["layers"] = layers
        argv += [interp.exe, "-I", "-S", "-B", *harness_args(False), json.dumps(cfg)]
        return _Launch(argv, {"PATH": "/usr/bin:/bin"}, None, [], info_fd=True, seccomp=prog)


class _Legacy:
    name = "legacy"

    def __init__(self) -> None:
        self.root = os.geteuid() == 0

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None, extra: tuple[str, ...] = ()) -> _Launch:
        interp = interpreter()
        workdir = tempfile.mkdtemp(prefix="mentor-sbx-")
        if program is not None:
            shutil.copyfile(program, os.path.join(workdir, "main.py"))
            cfg["main"] = "main.py"
        if uid is not None:
            for p in [workdir, *(os.path.join(workdir, n) for n in os.listdir(workdir))]:
                os.chown(p, uid, uid)
        os.chmod(workdir, 0o700)
        prog = seccomp_filter()
        cfg.update(legacy=True, uid=uid, prefix=interp.prefix, namespaces=limits.namespaces, audit=limits.audit,
                   prefix_usable=_world_usable(interp.exe) and _world_usable(os.path.join(interp.prefix, "lib")),
                   seccomp=prog.hex() if prog is not None else None, layers=["process", "env", "timeout", *extra])
        argv = [interp.exe, "-I", "-S", "-B", *harness_args(True), json.dumps(cfg)]
        return _Launch(argv, _clean_env(workdir), workdir, [workdir], pidns_waiter=limits.namespaces)


def _rlimit_cfg(role: str, limits: SandboxLimits) -> dict:
    cfg = {
        "role": role,
        "cpu_seconds": max(1, int(limits.cpu_seconds)),
        "memory_bytes": int(limits.memory_bytes),
        "file_bytes": int(limits.file_bytes),
        "processes": max(1, int(limits.processes)),
        "open_files": int(limits.open_files),
    }
    if role == "probe":
        cfg["nr"] = syscall_numbers()  # the probe tries add_key by number (glibc has no wrapper)
    return cfg


def _ready(read: list[int], write: list[int], timeout: float) -> tuple[set[int], set[int]]:
    """(readable, writable) among the fds within `timeout` seconds. poll, not select: a trainer
    process may hold more than FD_SETSIZE (1024) descriptors."""
    p = select.poll()
    for fd in read:
        p.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR | (select.POLLOUT if fd in write else 0))
    for fd in write:
        if fd not in read:
            p.register(fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    r, w = set(), set()
    for fd, ev in p.poll(max(0, int(timeout * 1000)) if timeout < 1e6 else None):
        if ev & (select.POLLIN | select.POLLHUP | select.POLLERR) and fd in read:
            r.add(fd)
        if ev & (select.POLLOUT | select.POLLERR | select.POLLHUP) and fd in write:
            w.add(fd)
    return r, w


class _Running:
    """A started sandbox, and the one way to end it that leaves neither processes nor zombies.

    SIGKILLing bwrap itself would orphan the sandbox's init (--die-with-parent
    kills it, but its zombie goes to the host's PID 1, which in a trainer's
    container may never reap). So the init is killed first (its host pid comes
    from bwrap's --info-fd; the kernel then kills and reaps everything in the
    namespace) and bwrap, still alive, reaps it and exits. The legacy backend's
    root waiter does the same on SIGTERM. SIGKILL of the process group is the
    fallback.
    """

    def __init__(self, launch: _Launch, **kw) -> None:
        argv, r, w, filt = launch.argv, None, None, None
        extra: list[str] = []
        try:
            if launch.info_fd:
                r, w = os.pipe()
                extra += ["--info-fd", str(w)]
            if launch.seccomp is not None:
                filt, fw = os.pipe()
                try:
                    os.write(fw, launch.seccomp)  # a few hundred bytes: well inside the pipe's buffer
                finally:
                    os.close(fw)
                extra += ["--seccomp", str(filt)]
            argv = [argv[0], *extra, *argv[1:]]
            if launch.cgroup_procs is not None:
                # The launcher enters the memory cgroup first; every process of the sandbox is then born in it.
                argv = ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', launch.cgroup_procs, *argv]
            self.launch = launch
            self.proc = subprocess.Popen(argv, env=launch.env, cwd=launch.cwd, close_fds=True, start_new_session=True,
                                         pass_fds=tuple(fd for fd in (w, filt) if fd is not None), **kw)
        except BaseException:
            if r is not None:
                os.close(r)
            raise
        finally:
            for fd in (w, filt):
                if fd is not None:
                    os.close(fd)
        self._info = r

    def _init_pid(self, timeout: float) -> int | None:
        if self._info is None:
            return None
        buf, deadline = b"", time.monotonic() + timeout
        while b"}" not in buf and time.monotonic() < deadline:
            ready, _ = _ready([self._info], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(self._info, 4096)
            if not chunk:
                break
            buf += chunk
        m = re.search(rb'"child-pid"\s*:\s*(\d+)\s*[,}\n]', buf)
        return int(m.group(1)) if m else None

    def end(self) -> None:
        """Kill whatever still runs and reap it; idempotent."""
        proc = self.proc
        if proc.poll() is None:
            if self.launch.info_fd:
                pid = self._init_pid(1.0)
                if pid is not None and proc.poll() is None:
                    try:
                        fd = os.pidfd_open(pid)
                        try:
                            signal.pidfd_send_signal(fd, signal.SIGKILL)
                        finally:
                            os.close(fd)
                    except OSError:
                        pass
            elif self.launch.pidns_waiter:
                proc.terminate()
            try:
                # A killed namespace always ends, but on a loaded machine the kernel can take seconds
                # to kill and reap it; SIGKILLing bwrap before then would leave the init's zombie behind.
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers outside a PID namespace (legacy without one)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if self._info is not None:
            os.close(self._info)
            self._info = None


def _start(impl, memcg: MemCgroups | None, role: str, limits: SandboxLimits, deadline: float,
           program: str | None = None, reset_peak: bool = False, **popen) -> tuple[_Lease, _Launch, _Running]:
    """Lease a slot (and its memory cgroup), build the launch, start it; frees what it took if that fails."""
    lease = _Lease(impl.root, memcg, limits, deadline)
    launch = None
    try:
        if reset_peak and memcg is not None and lease.procs:
            memcg.reset_peak(lease.name)
        launch = impl.launch(_rlimit_cfg(role, limits), lease.uid, limits, program, ("memcg",) if lease.procs else ())
        launch.cgroup_procs = lease.procs
        return lease, launch, _Running(launch, **popen)
    except BaseException:
        for d in launch.cleanup if launch else ():
            shutil.rmtree(d, ignore_errors=True)
        lease.release()
        raise


def _probe(impl, memcg: MemCgroups | None = None) -> tuple[list[str], dict] | None:
    """Run the probe role once: (layers, facts), or None when the backend does not start here."""
    lease = launch = None
    try:
        # The slot's peak is reset first (v1), so that a charge seen afterwards is this probe's.
        lease, launch, running = _start(impl, memcg, "probe", SandboxLimits(), time.monotonic() + 30, reset_peak=True,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = running.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = b"", b"probe timed out"
        finally:
            running.end()
        if running.proc.returncode != 0:
            log.info("mentor sandbox: %s probe failed (exit %s): %s", impl.name, running.proc.returncode, err.decode(errors="replace")[-300:])
            return None
        res = json.loads(out.decode().strip().splitlines()[-1])
        layers, facts = list(res["layers"]), dict(res["facts"])
        if lease.procs:
            facts["memcg_peak"] = memcg.peak(lease.name)  # type: ignore[union-attr]
        return layers, facts
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError, SandboxUnavailable) as exc:
        log.info("mentor sandbox: %s probe failed: %s", impl.name, exc)
        return None
    finally:
        for d in launch.cleanup if launch else ():
            shutil.rmtree(d, ignore_errors=True)
        if lease is not None:
            lease.release()


def _verified(layers: list[str], facts: dict) -> list[str]:
    """The probe's claimed layers, minus any its observed facts contradict."""
    ok = set(layers)
    if facts.get("uid") in (0, None) or facts.get("euid") in (0, None):
        ok -= {"uid"}
    if facts.get("caps") != 0 or facts.get("nnp") != 1:
        ok -= {"nocaps"}
    if facts.get("prefix") != interpreter().prefix:
        ok -= {"process"}  # another interpreter than this one answered (a library path gone wrong)
    if facts.get("route"):
        ok -= {"netns"}
    if facts.get("shadow_readable"):
        ok -= {"uid", "fsview"}
    if len(facts.get("proc_pids", [])) > 3 or facts.get("key_users"):
        ok -= {"procns"}
    # Each of these must have failed inside: they are what the filter is for.
    if any(facts.get(k, True) for k in ("keyring", "flock", "memfd", "shm", "userns")):
        ok -= {"seccomp"}
    if not {"size", "nr_inodes"} <= set(facts.get("tmp_opts", [])):
        ok -= {"tmpcap"}
    if "memcg" in ok and not (facts.get("memcg_peak") or 0) > 0:
        ok -= {"memcg"}  # nothing was charged to the cgroup: the probe did not run inside it
    # Only system directories, the work dir and the interpreter's top directory (e.g. /root for pyenv,
    # holding nothing but the bind-mounted prefix) may exist at the top of the view.
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp", "sandbox"}
    allowed |= {interpreter().prefix.split("/")[1], interpreter().exe.split("/")[1]}
    if not set(facts.get("root_listing", [])) <= allowed:
        ok -= {"fsview"}
    return [layer for layer in layers if layer in ok]


@dataclass
class Backend:
    impl: object
    layers: list[str]  # what the probe saw in force (plus "rlimits")
    facts: dict
    memcg: MemCgroups | None = None
    why_missing: dict[str, str] = field(default_factory=dict)  # layer -> why this host cannot have it

    @property
    def name(self) -> str:
        return self.impl.name  # type: ignore[attr-defined]


_BACKEND: Backend | None = None
_BACKEND_LOCK = threading.Lock()
_WARNED: set[str] = set()


def strict() -> bool:
    return os.environ.get("MENTOR_SANDBOX_STRICT", "") not in ("", "0")


def backend_for(impl) -> Backend | None:
    """The backend `impl` with the layers its probe verified; None when it does not start at all."""
    memcg, why = MemCgroups.discover()
    seen = _probe(impl, memcg)
    if seen is None and memcg is not None:
        why = f"the sandbox does not start inside a memory cgroup of {memcg.base}"
        memcg, seen = None, _probe(impl, None)
    if seen is None:
        return None
    layers = _verified(*seen)
    missing: dict[str, str] = {}
    if "memcg" not in layers:
        missing["memcg"] = why or "nothing was charged to the sandbox's memory cgroup"
        memcg = None
    if "seccomp" not in layers:
        missing["seccomp"] = (f"no syscall filter for this CPU ({platform.machine()})" if seccomp_filter() is None
                              else "the syscall filter did not hold in the probe")
    if "tmpcap" not in layers and memcg is None:
        missing["tmpcap"] = ("not root: /tmp is bwrap's tmpfs, limited in size only" if getattr(impl, "name", "") == "bwrap"
                             else "the legacy backend's work dir is on the host's /tmp")
    return Backend(impl, layers, seen[1], memcg, missing)


def backend() -> Backend:
    """The backend this process uses (probed once; MENTOR_SANDBOX=bwrap|legacy|auto)."""
    global _BACKEND
    with _BACKEND_LOCK:
        if _BACKEND is not None:
            return _BACKEND
        want = os.environ.get("MENTOR_SANDBOX", "auto")
        chosen = None
        if want in ("auto", "bwrap"):
            path = shutil.which("bwrap")
            if path:
                chosen = backend_for(_Bwrap(path))
            if chosen is None:
                why = "bubblewrap is not installed (apt-get install bubblewrap)" if not path else "bubblewrap cannot create its namespaces here"
                if want == "bwrap" or strict():
                    raise SandboxUnavailable(f"mentor sandbox: {why}")
                log.warning("mentor sandbox: %s; falling back to the legacy layers", why)
        if chosen is None:
            impl = _Legacy()
            chosen = backend_for(impl) or Backend(impl, [], {})
        _BACKEND = chosen
        return chosen


def check_layers(layers: list[str], where: str = "") -> None:
    """Warn once per process about each missing required layer; raise in strict mode."""
    missing = [layer for layer in REQUIRED_LAYERS if layer not in layers]
    if "memcg" in missing:
        missing += [layer for layer in MEMCG_FALLBACK if layer not in layers]
    if not missing:
        return
    why = _BACKEND.why_missing if _BACKEND is not None else {}
    if strict():
        raise SandboxUnavailable(f"mentor sandbox: layers not in force{where}: "
                                 + ", ".join(f"{m} ({why[m]})" if m in why else m for m in missing) + " (MENTOR_SANDBOX_STRICT=1)")
    for layer in missing:
        if layer not in _WARNED:
            _WARNED.add(layer)
            reason = f" ({why[layer]})" if layer in why else ""
            log.warning("mentor sandbox: layer %r is not in force%s%s: %s. See docs/sandbox.md (bubblewrap: "
                        "apt-get install bubblewrap); MENTOR_SANDBOX_STRICT=1 makes this an error",
                        layer, where, reason, LAYER_MEANING[layer])


def _identity_ok(ident: dict) -> bool:
    return isinstance(ident, dict) and ident.get("uid") not in (0, None) and ident.get("euid") not in (0, None)


# --------------------------------------------------------------------------- one program


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as ``main.py`` (``__name__ == "__main__"``) in a fresh sandbox; never raises for anything the code does.

    Raises `SandboxUnavailable` only before running anything (strict mode, no free slot).
    Its stdout and stderr go to files (at most `SandboxLimits.file_bytes` each, by RLIMIT_FSIZE),
    of which only the first `max_output` bytes are read.
    """
    limits = limits or SandboxLimits()
    be = backend()
    check_layers(be.layers, f" ({be.name} backend)")
    iodir = tempfile.mkdtemp(prefix="mentor-sbx-io-")  # root-only; never visible inside
    lease = launch = None
    try:
        start = time.monotonic()
        main = Path(iodir) / "main.py"
        main.write_text(code, encoding="utf-8")
        os.chmod(main, 0o644)
        in_path, out_path, err_path = (Path(iodir) / n for n in ("stdin", "stdout", "stderr"))
        in_path.write_text(stdin, encoding="utf-8")
        with open(in_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            lease, launch, running = _start(be.impl, be.memcg, "program", limits, start + 60, str(main),
                                            stdin=fin, stdout=fout, stderr=ferr)
            proc = running.proc
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                running.end()  # always: kills leftovers even after a clean exit
        duration = time.monotonic() - start
        stdout, out_cut = _read_capped(out_path, limits.max_output)
        stderr, err_cut = _read_capped(err_path, limits.max_output + 4096)
        layers: list[str] = []
        ident: dict = {}
        if stderr.startswith(_MARK):
            first, _, stderr = stderr.partition("\n")
            try:
                info = json.loads(first[len(_MARK):])
                layers, ident = list(info["layers"]), info["id"]
            except (ValueError, KeyError, TypeError):
                layers = []
        if layers and not _identity_ok(ident):
            layers = [layer for layer in layers if layer not in ("uid", "nocaps")]
        return SandboxResult(
            returncode=None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            duration=duration,
            layers=layers + (["timeout"] if layers and "timeout" not in layers else []),
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            backend=be.name,
        )
    finally:
        if lease is not None:
            lease.release()
        shutil.rmtree(iodir, ignore_errors=True)
        for d in launch.cleanup if launch else ():
            shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- a message-passing sandbox


def _small_object(pairs: list) -> dict:
    """JSON objects in messages have a handful of keys; a big one is refused before any dict is built."""
    if len(pairs) > 16:
        raise ValueError("a message object with more than 16 keys")
    return dict(pairs)


def _bounded_int(text: str) -> int:
    if len(text) > 4300:  # Python's own default limit; converting longer digit strings is quadratic
        raise ValueError("an integer of more than 4300 digits")
    return int(text)


def parse_message(line: bytes | str) -> dict | None:
    """One message line as a dict, in time linear in its length whatever it holds; None when it is not one.

    Messages are plain-data encodings (`plaincodec`: lists, not JSON objects), so JSON objects
    are kept small (no hash table built from the sandbox's keys) and, where this process turned
    Python's int-digit limit off, long integer literals are refused.
    """
    try:
        limit = sys.get_int_max_str_digits()
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
        self._lease: _Lease | None = None
        self._launch: _Launch | None = None
        self.proc: subprocess.Popen | None = None
        self._running: _Running | None = None
        be = backend()
        self.backend = be.name
        check_layers(be.layers, f" ({be.name} backend)")
        self._lease, self._launch, self._running = _start(be.impl, be.memcg, role, limits, deadline, stdin=subprocess.PIPE,
                                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.proc = self._running.proc
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._err = self.proc.stderr.fileno()  # type: ignore[union-attr]
        for f in (self._in, self._out, self._err):
            os.set_blocking(f, False)
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline
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
        if not _identity_ok(msg.get("hello")):
            self.failure = f"{self.role} sandbox is not running as an unprivileged uid ({msg.get('hello')!r:.100})"
            log.error("mentor sandbox: %s", self.failure)
            return False
        self.identity = msg["hello"]
        self.layers = [str(x) for x in msg.get("layers", [])] if isinstance(msg.get("layers"), list) else []
        self._close_err()  # from here on the harness writes nothing there (fd 2 is /dev/null inside)
        return True

    def send(self, obj: dict, deadline: float) -> bool:
        data = (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()
        view, sent = memoryview(data), 0
        while sent < len(data):
            left = deadline - time.monotonic()
            if left <= 0:
                self.failure = "timeout"
                return False
            rl = [self._err] if self._err_open else []
            r, w = _ready(rl, [self._in], left)
            if r:
                self._drain_err()
            if w:
                try:
                    sent += os.write(self._in, view[sent:])
                except BlockingIOError:
                    continue
                except OSError:  # it exited (EPIPE)
                    self.failure = "exited"
                    return False
        return True

    def recv(self, deadline: float) -> dict | None:
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
            r, _ = _ready(rl, [], left)
            if self._err_open and self._err in r:
                self._drain_err()
            if self._out in r:
                try:
                    chunk = os.read(self._out, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    self.failure = "exited"
                    return None
                self._buf += chunk
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]
        self._scanned = 0
        if len(line) > self.limits.max_message:
            self.failure = "oversized message"
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


def layers_here() -> list[str]:
    """The layers a run on this machine gets (probed once per process)."""
    return list(backend().layers)


__all__ = [
    "MEMCG_FALLBACK",
    "REQUIRED_LAYERS",
    "MemCgroups",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxResult",
    "SandboxUnavailable",
    "backend",
    "backend_for",
    "check_layers",
    "interpreter",
    "layers_here",
    "parse_message",
    "run_python",
    "seccomp_filter",
]
