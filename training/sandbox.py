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
Started as root, bwrap keeps only CAP_SETUID/SETGID/SETPCAP for ``setpriv``,
which empties the bounding set, sets no_new_privs and switches real, effective
and saved uid/gid to the run's own *slot uid* before exec'ing the interpreter
(no capabilities are left). The interpreter's prefix is bind-mounted at its own
path into that fresh root, whose directories (``/root`` included) are 0755,
so a pyenv Python under /root (0700 on the host) runs as the slot uid while
nothing else of /root exists inside. Started as a normal user, bwrap uses a
user namespace and the code keeps the user's own (unprivileged) uid.

``legacy`` (no bubblewrap, or it cannot create namespaces here): the previous
hand-written layers, see `sandbox_legacy`: unshare(2) namespaces, the whole
filesystem remounted read-only except the work dir, the interpreter exposed to
the slot uid, an audit-hook tripwire. It lacks ``fsview``: the code can read
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
``pidns``, ``procns``, ``uid`` (a real non-zero uid), ``nocaps`` (no
capabilities, no_new_privs), ``rlimits`` (CPU, address space, file size,
processes, open files, no core), ``nproc`` (PID namespace + RLIMIT_NPROC of a
uid of its own: a fork bomb is bounded whatever the uid), ``timeout`` (wall
clock kill), ``audit`` (legacy tripwire, never required). When one of
`REQUIRED_LAYERS` is missing, a warning naming it is logged once per process;
with ``MENTOR_SANDBOX_STRICT=1`` the run refuses instead (`SandboxUnavailable`).
Whatever the backend, code never runs as uid 0: the harness checks its own
identity before any untrusted code runs and exits if it is root.

Guarantees (bwrap, defaults): the code cannot outlive the wall-clock limit or
its CPU limit, allocate more than the address-space limit per process, start
more processes than `SandboxLimits.processes` (1 for worker and tester: no
fork, no threads), reach any network, see other processes, read the caller's
environment or any file outside /usr and the interpreter's standard library,
write anything but its tmpfs, or keep processes alive after the run. Not
guaranteed: protection from kernel exploits (it shares the host kernel) and
from CPU/memory-bandwidth contention. For hostile workloads at scale run the
verifier behind a VM/container sandbox service (see `code_verify`'s runner seam).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import re
import select
import shutil
import signal
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
REQUIRED_LAYERS = ("process", "env", "fsview", "netns", "pidns", "procns", "uid", "nocaps", "rlimits", "nproc", "timeout")
# What a missing layer means, as the warning says it.
LAYER_MEANING = {
    "process": "the code does not run in a separate isolated interpreter",
    "env": "the code sees the caller's environment variables",
    "fsview": "the code can read every world-readable file, datasets and their tests included",
    "netns": "the code can reach the network",
    "pidns": "the code can see other processes and leave processes behind",
    "procns": "the code can see other processes in /proc",
    "uid": "the code does not run as an unprivileged uid of its own",
    "nocaps": "the code keeps capabilities",
    "rlimits": "its CPU, memory, file-size and process limits are not all set",
    "nproc": "it has no process limit of its own: a fork bomb is bounded only by the wall-clock kill",
    "timeout": "it has no wall-clock limit",
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
    max_output: int = 64 << 10  # bytes of stdout/stderr kept
    max_message: int = 4 << 20  # largest worker/tester message
    namespaces: bool = True  # legacy backend: try namespaces
    audit: bool = True  # legacy backend: the audit-hook tripwire


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


class _Bwrap:
    name = "bwrap"
    layers = ("process", "env", "fsview", "netns", "pidns", "procns", "uid", "nocaps", "timeout", "nproc")

    def __init__(self, path: str) -> None:
        self.path = path
        self.root = os.geteuid() == 0

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None) -> _Launch:
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
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", str(int(limits.tmp_bytes)), "--tmpfs", "/tmp"]
        if program is not None:
            argv += ["--perms", "0755", "--dir", "/sandbox", "--ro-bind", program, "/sandbox/main.py"]
            cfg["main"] = "/sandbox/main.py"
        argv += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in _clean_env("/tmp").items():
            argv += ["--setenv", k, v]
        if self.root:
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--",
                     "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        else:
            argv += ["--"]
        cfg["layers"] = list(self.layers)
        argv += [interp.exe, "-I", "-S", "-B", "-c", harness_source(False), json.dumps(cfg)]
        return _Launch(argv, {"PATH": "/usr/bin:/bin"}, None, [], info_fd=True)


class _Legacy:
    name = "legacy"

    def __init__(self) -> None:
        self.root = os.geteuid() == 0

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None) -> _Launch:
        interp = interpreter()
        workdir = tempfile.mkdtemp(prefix="mentor-sbx-")
        if program is not None:
            shutil.copyfile(program, os.path.join(workdir, "main.py"))
            cfg["main"] = "main.py"
        if uid is not None:
            for p in [workdir, *(os.path.join(workdir, n) for n in os.listdir(workdir))]:
                os.chown(p, uid, uid)
        os.chmod(workdir, 0o700)
        cfg.update(legacy=True, uid=uid, prefix=interp.prefix, namespaces=limits.namespaces, audit=limits.audit,
                   prefix_usable=_world_usable(interp.exe) and _world_usable(os.path.join(interp.prefix, "lib")),
                   layers=["process", "env", "timeout"])
        argv = [interp.exe, "-I", "-S", "-B", "-c", harness_source(True), json.dumps(cfg)]
        return _Launch(argv, _clean_env(workdir), workdir, [workdir], pidns_waiter=limits.namespaces)


def _rlimit_cfg(role: str, limits: SandboxLimits) -> dict:
    return {
        "role": role,
        "cpu_seconds": max(1, int(limits.cpu_seconds)),
        "memory_bytes": int(limits.memory_bytes),
        "file_bytes": int(limits.file_bytes),
        "processes": max(1, int(limits.processes)),
        "open_files": int(limits.open_files),
    }


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
        argv, r, w = launch.argv, None, None
        if launch.info_fd:
            r, w = os.pipe()
            argv = [argv[0], "--info-fd", str(w), *argv[1:]]
        self.launch = launch
        try:
            self.proc = subprocess.Popen(argv, env=launch.env, cwd=launch.cwd, close_fds=True, start_new_session=True,
                                         pass_fds=(w,) if w is not None else (), **kw)
        except BaseException:
            if r is not None:
                os.close(r)
            raise
        finally:
            if w is not None:
                os.close(w)
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


def _probe(backend) -> tuple[list[str], dict] | None:
    """Run the probe role once: (layers, facts), or None when the backend does not start here."""
    deadline = time.monotonic() + 30
    uid = fd = None
    try:
        if backend.root:
            uid, fd = _SLOTS.acquire(deadline)
        launch = backend.launch(_rlimit_cfg("probe", SandboxLimits()), uid, SandboxLimits(), None)
        try:
            res = subprocess.run(launch.argv, env=launch.env, cwd=launch.cwd, capture_output=True, timeout=30, close_fds=True)
        finally:
            for d in launch.cleanup:
                shutil.rmtree(d, ignore_errors=True)
        if res.returncode != 0:
            log.info("mentor sandbox: %s probe failed (exit %s): %s", backend.name, res.returncode, res.stderr.decode(errors="replace")[-300:])
            return None
        out = json.loads(res.stdout.decode().strip().splitlines()[-1])
        return out["layers"], out["facts"]
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError, SandboxUnavailable) as exc:
        log.info("mentor sandbox: %s probe failed: %s", backend.name, exc)
        return None
    finally:
        _SLOTS.release(fd)


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
    if len(facts.get("proc_pids", [])) > 3:
        ok -= {"procns"}
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

    @property
    def name(self) -> str:
        return self.impl.name  # type: ignore[attr-defined]


_BACKEND: Backend | None = None
_BACKEND_LOCK = threading.Lock()
_WARNED: set[str] = set()


def strict() -> bool:
    return os.environ.get("MENTOR_SANDBOX_STRICT", "") not in ("", "0")


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
                impl = _Bwrap(path)
                seen = _probe(impl)
                if seen is not None:
                    chosen = Backend(impl, _verified(*seen), seen[1])
            if chosen is None:
                why = "bubblewrap is not installed (apt-get install bubblewrap)" if not path else "bubblewrap cannot create its namespaces here"
                if want == "bwrap" or strict():
                    raise SandboxUnavailable(f"mentor sandbox: {why}")
                log.warning("mentor sandbox: %s; falling back to the legacy layers", why)
        if chosen is None:
            impl = _Legacy()
            seen = _probe(impl)
            chosen = Backend(impl, _verified(*seen) if seen else [], seen[1] if seen else {})
        _BACKEND = chosen
        return chosen


def check_layers(layers: list[str], where: str = "") -> None:
    """Warn once per process about each missing required layer; raise in strict mode."""
    missing = [layer for layer in REQUIRED_LAYERS if layer not in layers]
    if not missing:
        return
    if strict():
        raise SandboxUnavailable(f"mentor sandbox: layers not in force{where}: {', '.join(missing)} (MENTOR_SANDBOX_STRICT=1)")
    for layer in missing:
        if layer not in _WARNED:
            _WARNED.add(layer)
            log.warning("mentor sandbox: layer %r is not in force%s: %s. Install bubblewrap "
                        "(apt-get install bubblewrap); MENTOR_SANDBOX_STRICT=1 makes this an error", layer, where, LAYER_MEANING[layer])


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
    """
    limits = limits or SandboxLimits()
    be = backend()
    check_layers(be.layers, f" ({be.name} backend)")
    iodir = tempfile.mkdtemp(prefix="mentor-sbx-io-")  # root-only; never visible inside
    uid = fd = None
    launch = None
    try:
        start = time.monotonic()
        if be.impl.root:  # type: ignore[attr-defined]
            uid, fd = _SLOTS.acquire(start + 60)
        main = Path(iodir) / "main.py"
        main.write_text(code, encoding="utf-8")
        os.chmod(main, 0o644)
        launch = be.impl.launch(_rlimit_cfg("program", limits), uid, limits, str(main))  # type: ignore[attr-defined]
        in_path, out_path, err_path = (Path(iodir) / n for n in ("stdin", "stdout", "stderr"))
        in_path.write_text(stdin, encoding="utf-8")
        with open(in_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            running = _Running(launch, stdin=fin, stdout=fout, stderr=ferr)
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
        _SLOTS.release(fd)
        shutil.rmtree(iodir, ignore_errors=True)
        for d in launch.cleanup if launch else ():
            shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- a message-passing sandbox


class SandboxProcess:
    """A running worker/tester sandbox: JSON objects, one per line, each way, under a deadline.

    `recv` returns None (and sets `failure`) on a timeout, an exit, an
    oversized line or anything that is not one JSON object; the caller then
    treats the whole check as failed. `close` kills it and frees its slot.
    """

    def __init__(self, role: str, limits: SandboxLimits, deadline: float) -> None:
        self.role = role
        self.limits = limits
        self.failure: str | None = None
        self.layers: list[str] = []
        self.identity: dict = {}
        self._fd: int | None = None
        self._launch: _Launch | None = None
        self.proc: subprocess.Popen | None = None
        self._running: _Running | None = None
        be = backend()
        self.backend = be.name
        check_layers(be.layers, f" ({be.name} backend)")
        uid = None
        if be.impl.root:  # type: ignore[attr-defined]
            uid, self._fd = _SLOTS.acquire(deadline)
        try:
            self._launch = be.impl.launch(_rlimit_cfg(role, limits), uid, limits, None)  # type: ignore[attr-defined]
            self._running = _Running(self._launch, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.proc = self._running.proc
        except BaseException:
            self.close()
            raise
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._err = self.proc.stderr.fileno()  # type: ignore[union-attr]
        for f in (self._in, self._out, self._err):
            os.set_blocking(f, False)
        self._buf = b""
        self.stderr = bytearray()

    def _drain_err(self) -> None:
        try:
            chunk = os.read(self._err, 1 << 16)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            self._err_open = False
        elif len(self.stderr) < self.limits.max_output:
            self.stderr += chunk[: self.limits.max_output - len(self.stderr)]

    _err_open = True

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
        return True

    def send(self, obj: dict, deadline: float) -> bool:
        data = (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()
        while data:
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
                    data = data[os.write(self._in, data):]
                except BlockingIOError:
                    continue
                except OSError:  # it exited (EPIPE)
                    self.failure = "exited"
                    return False
        return True

    def recv(self, deadline: float) -> dict | None:
        while b"\n" not in self._buf:
            if len(self._buf) > self.limits.max_message:
                self.failure = "oversized message"
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                self.failure = "timeout"
                return None
            rl = [self._out] + ([self._err] if self._err_open else [])
            r, _ = _ready(rl, [], left)
            if self._err in r:
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
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > self.limits.max_message:
            self.failure = "oversized message"
            return None
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            self.failure = "malformed message"
            return None
        if type(obj) is not dict:
            self.failure = "malformed message"
            return None
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
        _SLOTS.release(self._fd)
        self._fd = None
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
    "REQUIRED_LAYERS",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxResult",
    "SandboxUnavailable",
    "backend",
    "check_layers",
    "interpreter",
    "layers_here",
    "run_python",
]
