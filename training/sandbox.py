"""Run untrusted Python (model-written code) in a contained child process.

Used by the code verifier (`mentor.training.verify`) for HumanEval-style
``check(candidate)`` tests and stdin/stdout cases (LiveCodeBench style).

Layers (each run applies every layer the machine allows; `SandboxResult.layers`
lists the ones that were actually in force for that run):

``process``   a separate ``python -I -S`` interpreter (isolated mode: no
              PYTHON* variables, no user site, no site-packages; only the
              standard library can be imported), in its own session / process
              group, started without ``preexec_fn`` (safe from threaded callers).
``env``       a clean environment: PATH, LANG, HOME/TMPDIR = the work dir and
              nothing else, so the caller's secrets (API keys, tokens) are not
              inherited.
``workdir``   an empty temporary working directory, removed afterwards.
``rlimits``   RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE
              (largest file it may write, which also caps its stdout/stderr: they
              are files), RLIMIT_NPROC (processes/threads of its uid),
              RLIMIT_NOFILE, RLIMIT_CORE = 0.
``netns``     a fresh, empty network namespace (only a down loopback): no route
              anywhere. As root via unshare(CLONE_NEWNET); as a normal user via a
              user namespace (unshare(CLONE_NEWUSER|CLONE_NEWNET)) when the kernel
              allows unprivileged user namespaces.
``pidns``     a fresh PID namespace: the code runs as its init (PID 1), so when it
              exits or is killed the kernel kills every process it started, even
              ones that left the process group with setsid(). Its parent-death
              signal is SIGKILL, so killing the sandbox's launcher kills it too.
``fsro``      a private mount namespace in which every mount is remounted
              read-only except the work dir: writing or deleting anything outside
              it fails with EROFS, whatever the file permissions say.
``procns``    a /proc of the new PID namespace: other processes (and their
              /proc/<pid>/environ) are not visible at all.
``uid``       when started as root and `nobody` can read the interpreter, the code
              runs as ``nobody`` (65534) with no supplementary groups: it cannot
              write or delete files it does not own, and RLIMIT_NPROC (which the
              kernel does not apply to uid 0) becomes effective.
``nocaps``    when it has to stay uid 0 (an interpreter under /root, as with
              pyenv): every capability is dropped (effective, permitted and the
              bounding set) and no_new_privs is set, so it cannot remount, bypass
              file permissions, leave its namespaces or regain privileges.
``audit``     an audit hook (PEP 578) installed before the code runs, which cannot
              be removed from Python: it refuses socket creation/connection/DNS,
              launching programs (exec, spawn, system, posix_spawn, subprocess),
              loading native code through ctypes, forking (unless ``allow_fork``),
              signalling processes, writing, renaming or deleting paths outside
              the work dir, and reading another process's /proc entries. It is
              the only network and file layer where namespaces are unavailable
              (non-root, no user namespaces).
``timeout``   a wall-clock deadline after which the whole process group (and,
              with ``pidns``, the namespace) is SIGKILLed; output beyond
              `max_output` bytes is cut off.

Guarantees (with the defaults, on Linux): the code cannot run longer than the
wall-clock timeout or use more CPU seconds than the CPU limit, cannot allocate
more than the address-space limit, cannot leave processes behind (``pidns``,
else the process group kill), cannot fork (``audit``; with ``allow_fork``,
RLIMIT_NPROC under ``uid`` or a non-root caller, plus the PID namespace), cannot
reach the network (``netns`` and ``audit``), cannot see the caller's environment
variables (``env``, plus ``procns``/``uid``/``audit`` for /proc), and cannot
write or delete files outside its work dir (``fsro``, ``uid`` and ``audit``).
Where namespaces are available (root, or unprivileged user namespaces) each of
these holds with at least two independent layers, except forking as uid 0
without the ``uid`` layer: the kernel exempts uid 0 from RLIMIT_NPROC, so there
the audit layer alone refuses fork, with the PID namespace and the wall-clock
kill as the backstop.

Not guaranteed: this is not a security boundary against a determined attacker
with a kernel exploit; it shares the host kernel. Without namespaces (non-root,
user namespaces disabled) the file and network protection is the audit hook
alone, which stops Python-level operations but not a bug in an interpreter
extension. The code can *read* files its uid may read (for uid 0 without
capabilities: files owned by root, e.g. the caller's data; with ``uid``:
world-readable files only), and it shares CPU and memory bandwidth with other
processes. RLIMIT_NPROC counts every process of the uid, so code that
legitimately forks or starts threads may fail. Threads and subprocesses are not
supported by design. For hostile workloads at scale run this inside a container
or VM sandbox (gVisor, Firecracker, nsjail) and keep it as the inner layer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

NOBODY = 65534

# Runs inside the child, before the untrusted code, with `python -I -S -c`.
# Kept self-contained (stdlib only) and applied in this order: namespaces (need
# privileges we are about to drop) -> fork into the PID namespace -> drop uid ->
# parent-death signal -> rlimits -> audit hook -> the code.
_BOOTSTRAP = r'''
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
sys.argv = ["main.py"]
layers = ["process", "env", "workdir", "timeout"]
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
PR_SET_PDEATHSIG = 1

CLONE_NEWNS = 0x00020000

def unshare(flags):
    return cfg["namespaces"] and libc.unshare(flags) == 0

def readonly_filesystem(workdir):
    # In the new mount namespace: every mount read-only except the work dir
    # (bind-mounted onto itself first, so it is a mount of its own).
    MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
    keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    wd = workdir.encode()
    if libc.mount(wd, wd, None, MS_BIND | MS_REC, None) != 0:
        return False
    ok = True
    with open("/proc/self/mountinfo") as fh:
        entries = [line.split() for line in fh]
    for f in entries:
        point = f[4]
        for code in ("\\040", "\\011", "\\012", "\\134"):
            point = point.replace(code, chr(int(code[-3:], 8)))
        if point == workdir:
            continue
        # Locked per-mount flags (nosuid, nodev, ...) must be kept or the kernel refuses.
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | sum(keep.get(o, 0) for o in f[5].split(","))
        if libc.mount(None, point.encode(), None, flags, None) != 0 and not point.startswith(("/proc", "/sys", "/dev")):
            ok = False
    os.chdir(workdir)  # the old cwd is the directory under the bind mount (now read-only)
    return ok

root = os.geteuid() == 0
ns = []
names = {CLONE_NEWNET: "netns", CLONE_NEWPID: "pidns", CLONE_NEWNS: "mountns"}
base = 0 if root else CLONE_NEWUSER
for extra in (CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS, CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET):
    if unshare(base | extra):
        ns = [n for flag, n in names.items() if extra & flag]
        break
if "mountns" in ns:
    ns.remove("mountns")
    if readonly_filesystem(os.path.realpath(os.getcwd())):
        ns.append("fsro")
layers += ns

if "pidns" in ns:
    # The first child in the new PID namespace is its init: when it dies the
    # kernel kills everything else in the namespace.
    alive_r, alive_w = os.pipe()  # EOF on alive_r once the launcher is gone
    pid = os.fork()
    if pid:
        os.close(alive_r)
        signal.signal(signal.SIGTERM, lambda *a: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status))

if "pidns" in ns and "fsro" in ns:
    # A /proc of the new PID namespace: host processes (and their environ) disappear from view.
    if libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) == 0:
        layers.append("procns")

if root and cfg["drop_root"]:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
    layers.append("uid")
elif root:
    # Staying uid 0 (nobody cannot read this interpreter): give up every
    # capability, so the code cannot remount, override file permissions,
    # leave its namespaces or regain privileges through exec.
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable = 0 (two 32-bit words each)
    if libc.capset(header, data) == 0:
        layers.append("nocaps")
if "pidns" in ns:
    # Set after setuid (a credential change clears it).
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.close(alive_w)
    import select
    if select.select([alive_r], [], [], 0)[0]:
        os._exit(137)  # the launcher died before the signal was armed
    os.close(alive_r)

def limit(res, value):
    try:
        resource.setrlimit(res, (value, value))
        return True
    except (ValueError, OSError):
        return False

ok = all([
    limit(resource.RLIMIT_CPU, cfg["cpu_seconds"]),
    limit(resource.RLIMIT_AS, cfg["memory_bytes"]),
    limit(resource.RLIMIT_FSIZE, cfg["file_bytes"]),
    limit(resource.RLIMIT_NPROC, cfg["processes"]),
    limit(resource.RLIMIT_NOFILE, cfg["open_files"]),
    limit(resource.RLIMIT_CORE, 0),
])
if ok:
    layers.append("rlimits")

WORKDIR = os.path.realpath(os.getcwd())
SELF = os.path.basename(os.readlink("/proc/self"))
BLOCKED = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
           "os.exec", "os.spawn", "os.system", "os.posix_spawn", "os.forkpty", "subprocess.Popen",
           "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.cdata",
           "ctypes.call_function", "os.setxattr", "os.removexattr", "os.chflags", "os.putenv",
           "os.kill", "os.killpg", "signal.pthread_kill"}
PATH_WRITES = {"os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown",
               "os.mkdir", "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move",
               "shutil.copyfile", "shutil.copytree"}

def inside(path):
    try:
        if isinstance(path, int):
            return True  # an fd it already holds
        p = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return p == WORKDIR or p.startswith(WORKDIR + os.sep)

def proc_other(path):
    try:
        p = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    parts = p.split(os.sep)
    return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != SELF

def hook(event, args):
    if event in BLOCKED:
        raise PermissionError(f"mentor sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        if proc_other(path):
            raise PermissionError(f"mentor sandbox: reading {path} is not allowed")
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writing and not inside(path):
            raise PermissionError(f"mentor sandbox: writing {path} is not allowed")
    elif event in PATH_WRITES:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                raise PermissionError(f"mentor sandbox: {event} on {a} is not allowed")

if not cfg["allow_fork"]:
    BLOCKED |= {"os.fork"}

def guarded(event, args):
    if event == "import" and args[0] in ("_posixsubprocess", "_ctypes", "_xxsubinterpreters"):
        raise PermissionError(f"mentor sandbox: importing {args[0]} is not allowed")
    hook(event, args)

if cfg["audit"]:
    sys.addaudithook(guarded)
    layers.append("audit")
sys.stderr.write("\x00MENTOR-SANDBOX-LAYERS " + ",".join(layers) + "\n")
sys.stderr.flush()
del ctypes, libc, cfg, ok, root, ns, limit
with open("main.py", "rb") as _fh:
    _src = _fh.read()
_g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
exec(compile(_src, "main.py", "exec"), _g)
'''

_LAYERS_MARK = "\x00MENTOR-SANDBOX-LAYERS "


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # address space; CPython itself needs ~30 MiB
    file_bytes: int = 16 << 20  # largest file (also stdout/stderr) it may write
    processes: int = 32  # RLIMIT_NPROC: processes/threads of its uid
    open_files: int = 64
    max_output: int = 64 << 10  # bytes of stdout/stderr kept
    namespaces: bool = True  # try network/PID namespaces
    drop_root: bool = True  # run as nobody when started as root
    audit: bool = True  # the audit-hook layer
    # Python-level fork (os.fork, multiprocessing) is refused by the audit layer
    # unless allowed; then only RLIMIT_NPROC and the PID namespace bound it, and
    # RLIMIT_NPROC does not bind uid 0 (see `nproc_enforced`).
    allow_fork: bool = False


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

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _world_usable(path: Path) -> bool:
    """Whether a user who is neither owner nor group member can read `path` and traverse its parents."""
    path = path.resolve()
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return False
        if not mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


@lru_cache(maxsize=1)
def nobody_can_run_python() -> bool:
    """Whether `nobody` could import this interpreter's standard library.

    Not so when Python lives under a private home (pyenv in /root): then the
    sandbox keeps the caller's uid and the ``uid`` layer is not applied.
    """
    import sysconfig

    paths = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], os.path.realpath(sys.executable)}
    return all(_world_usable(Path(p)) for p in paths)


def nproc_enforced() -> bool:
    """Whether RLIMIT_NPROC binds sandboxed code here (the kernel exempts uid 0)."""
    return os.geteuid() != 0 or nobody_can_run_python()


def _clean_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as ``main.py`` in a fresh sandbox; never raises for anything the code does."""
    limits = limits or SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="mentor-sbx-")
    iodir = tempfile.mkdtemp(prefix="mentor-sbx-io-")  # outside the work dir: the code cannot reach it by path
    try:
        main = Path(workdir) / "main.py"
        main.write_text(code, encoding="utf-8")
        root = os.geteuid() == 0
        drop = root and limits.drop_root and nobody_can_run_python()
        if drop:
            os.chown(workdir, NOBODY, NOBODY)
            os.chown(main, NOBODY, NOBODY)
        os.chmod(workdir, 0o700)
        cfg = {
            "cpu_seconds": max(1, int(limits.cpu_seconds)),
            "memory_bytes": int(limits.memory_bytes),
            "file_bytes": int(limits.file_bytes),
            "processes": int(limits.processes),
            "open_files": int(limits.open_files),
            "namespaces": limits.namespaces,
            "drop_root": drop,
            "allow_fork": limits.allow_fork,
            "uid": NOBODY,
            "audit": limits.audit,
        }
        in_path, out_path, err_path = (Path(iodir) / n for n in ("stdin", "stdout", "stderr"))
        in_path.write_text(stdin, encoding="utf-8")
        start = time.monotonic()
        with open(in_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, json.dumps(cfg)],
                cwd=workdir,
                env=_clean_env(workdir),
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                start_new_session=True,  # its own process group, killed as a whole
                close_fds=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Always: kills leftovers (a fork bomb's orphans) even after a clean exit.
                _kill_group(proc.pid)
                proc.wait()
        duration = time.monotonic() - start
        stdout, out_cut = _read_capped(out_path, limits.max_output)
        stderr, err_cut = _read_capped(err_path, limits.max_output + 512)
        layers: list[str] = []
        if stderr.startswith(_LAYERS_MARK):
            first, _, stderr = stderr.partition("\n")
            layers = first[len(_LAYERS_MARK):].split(",")
        return SandboxResult(
            returncode=None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            duration=duration,
            layers=layers,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(iodir, ignore_errors=True)


__all__ = ["SandboxLimits", "SandboxResult", "nobody_can_run_python", "nproc_enforced", "run_python"]
