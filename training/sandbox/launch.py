"""Starting and ending one sandbox: the interpreter and harness it runs, the launch of each backend
(bubblewrap's command line, or the legacy layers' harness config), and the one way to end it
that leaves neither processes nor zombies (`Running.end`)."""

from __future__ import annotations

import binascii
import json
import marshal
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mentor.training.sandbox import view as sandbox_view
from mentor.training.sandbox.cgroups import MemCgroups
from mentor.training.sandbox.layers import SandboxLimits
from mentor.training.sandbox.seccomp import seccomp_filter, syscall_numbers
from mentor.training.sandbox.slots import Lease

HERE = Path(__file__).resolve().parent  # this package: the harness's files
TRAINING = HERE.parent  # plaincodec.py, the data format both sides of the boundary use


# --------------------------------------------------------------------------- interpreter


@dataclass(frozen=True)
class Interpreter:
    exe: str  # real path of the binary
    prefix: str  # its installation prefix (stdlib under prefix/lib/pythonX.Y)
    site_packages: tuple[str, ...]  # hidden inside the sandbox
    stdlib: tuple[str, ...] = ()  # its standard library's directories (what `view` copies)


@lru_cache(maxsize=1)
def interpreter() -> Interpreter:
    """The interpreter sandboxes run: this one's base (not a venv), or MENTOR_SANDBOX_PYTHON."""
    override = os.environ.get("MENTOR_SANDBOX_PYTHON")
    if override:
        exe = os.path.realpath(shutil.which(override) or override)
        out = subprocess.run([exe, "-I", "-S", "-c", "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_path('purelib')); "
                              "print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('platstdlib'))"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")
        prefix, site, std = out[0], (out[1],), (out[2], out[3])
    else:
        exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        prefix = sys.base_prefix
        site = tuple({sysconfig.get_path("purelib", vars={"base": prefix}), sysconfig.get_path("platlib", vars={"platbase": prefix})})
        bases = dict.fromkeys(("base", "platbase", "installed_base", "installed_platbase"), prefix)
        std = (sysconfig.get_path("stdlib", vars=bases), sysconfig.get_path("platstdlib", vars=bases))
    real = lambda paths: tuple(dict.fromkeys(os.path.realpath(p) for p in paths))  # noqa: E731
    return Interpreter(exe, os.path.realpath(prefix), real(site), real(std))


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


def harness_files(legacy: bool) -> tuple[Path, ...]:
    """The harness source, in the order it is pasted into the one program a sandbox runs (one namespace:
    each file uses the names of the files before it, and `main` comes last)."""
    parts = ("harness_legacy.py",) * legacy + ("harness_channel.py", "harness_tester.py", "harness_probe.py", "harness.py")
    return (TRAINING / "plaincodec.py", *(HERE / name for name in parts))


@lru_cache(maxsize=2)
def harness_source(legacy: bool) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in harness_files(legacy)) + "\nmain()\n"


_LOADER = "import binascii, marshal, sys; exec(marshal.loads(binascii.a2b_base64(sys.argv.pop(1))))"


@lru_cache(maxsize=2)
def harness_args(legacy: bool) -> tuple[str, ...]:
    """What follows ``python -I -S -B`` to run the harness: ``-c SOURCE``, or, when the sandbox runs this
    very interpreter, its code object compiled once here and marshalled (this interpreter's format), which
    saves every sandbox compiling 39 KB of source (54 KB legacy; about 5 ms of its CPU; unmarshalling takes 0.2 ms)."""
    src = harness_source(legacy)
    if os.environ.get("MENTOR_SANDBOX_PYTHON") or interpreter().exe != os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable):
        return ("-c", src)
    blob = binascii.b2a_base64(marshal.dumps(compile(src, "<string>", "exec")), newline=False).decode()
    if len(blob) >= 131_000:  # one argument may hold at most 128 KiB (MAX_ARG_STRLEN, its NUL included)
        return ("-c", src)
    return ("-c", _LOADER, blob)


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
class Launch:
    argv: list[str]
    env: dict[str, str] | None
    cwd: str | None
    cleanup: list[str]  # host directories to remove afterwards
    info_fd: bool = False  # bwrap: report the sandbox init's pid on --info-fd
    pidns_waiter: bool = False  # legacy with a PID namespace: the child waits for the sandbox's init
    seccomp: bytes | None = None  # bwrap: the filter, handed over on --seccomp FD
    cgroup_procs: str | None = None  # the memory cgroup the launcher enters before it starts anything


# /proc files that show other uids' state through a private /proc (key quotas of every uid, locks), and
# the host's cumulative counters that a run can move and a later run read back (state across runs):
# /proc/stat's fork count rose by exactly 3 between two sandbox runs here, plus whatever the first
# forked; /proc/vmstat counts OOM kills; /proc/meminfo's Shmem moves by exactly what a sandbox holds
# in its /tmp (read by one scored beside it), the load average by what a run spun; CPU, interrupt,
# disk and pressure totals are the same kind, only noisier. Hidden with the rest of /proc's global files where /proc can be mounted
# ``subset=pid``; these are the masks where it cannot (kernels before 5.8).
_PROC_MASKS = ("/proc/key-users", "/proc/keys", "/proc/locks", "/proc/stat", "/proc/vmstat", "/proc/zoneinfo",
               "/proc/loadavg", "/proc/meminfo", "/proc/interrupts", "/proc/softirqs", "/proc/diskstats", "/proc/schedstat", "/proc/uptime")
_PROC_DIR_MASKS = ("/proc/pressure",)


class Bwrap:
    name = "bwrap"
    layers = ("process", "env", "fsview", "netns", "pidns", "procns", "uid", "nocaps", "timeout", "nproc")

    def __init__(self, path: str) -> None:
        self.path = path
        self.root = os.geteuid() == 0
        interp = interpreter()
        sh = shutil.which("sh", path="/usr/bin:/bin")  # for the code's own subprocess(shell=True)
        # What the sandbox reads comes from a copy in RAM (`view`); without one, from the disk.
        self.view, self.view_why = sandbox_view.ensure(interp.exe, interp.stdlib, interp.site_packages, (sh,) if sh else ())
        self._view_args = sandbox_view.bwrap_args(self.view) if self.view else None

    def _disk_view(self) -> list[str]:
        interp = interpreter()
        argv = ["--ro-bind", "/usr", "/usr"]
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
        return argv

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None, extra: tuple[str, ...] = ()) -> Launch:
        interp = interpreter()
        argv = [self.path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session"]
        if not self.root:
            # As root of its user namespace (--uid 0, which owns the sandbox's mounts) the harness mounts /tmp
            # with an inode limit and remounts /proc, then takes the caller's uid in a user namespace of its
            # own and loads the filter itself (`harness.drop_privileges`); bwrap's --disable-userns
            # would forbid that namespace: the filter's CLONE_NEWUSER rule forbids any after it.
            argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
        layers = list(self.layers) + list(extra)
        if self._view_args is not None:
            argv += self._view_args
            layers.append("ramview")
        else:
            argv += self._disk_view()
        # /dev is bwrap's own tmpfs, with no size or inode limit, and as a normal user the code's uid owns it:
        # read-only (its device nodes and /dev/pts are mounts of their own and keep working).
        argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
        # /tmp gets an inode limit as well as a size, whether or not a memory cgroup charges its inodes
        # (400,000 empty files pinned 366 MiB of unreclaimable kernel memory in one sample, well inside
        # the cgroup's 1.08 GiB), and /proc loses what is not the sandbox's own processes: the harness
        # does both before it drops its privileges (`harness.drop_privileges`; bwrap's --tmpfs
        # takes a size only, and one remount of /proc costs less than 12 bind mounts), as root or as root
        # of bwrap's user namespace.
        argv += ["--perms", "1777", "--dir", "/tmp"]
        cfg["drop"] = {"uid": uid, "tmp": f"size={int(limits.tmp_bytes)},nr_inodes={int(limits.tmp_inodes)},mode=1777",
                       "proc_masks": _PROC_MASKS, "proc_dir_masks": _PROC_DIR_MASKS}
        if not self.root:
            cfg["drop"].update(uid=None, ids=[os.getuid(), os.getgid()])
        if program is not None:
            argv += ["--perms", "0755", "--dir", "/sandbox", "--ro-bind", program, "/sandbox/main.py"]
            cfg["main"] = "/sandbox/main.py"
        argv += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for k, v in _clean_env("/tmp").items():
            argv += ["--setenv", k, v]
        # As a normal user, CAP_SETFCAP is what lets the harness map its new namespace's uid onto uid 0 here.
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_SYS_ADMIN") if self.root else ("CAP_SYS_ADMIN", "CAP_SETFCAP"):
            argv += ["--cap-add", cap]
        argv += ["--"]
        prog = seccomp_filter()
        if prog is not None and self.root:
            layers.append("seccomp")
        elif prog is not None:
            cfg["seccomp"] = prog.hex()  # loaded by the harness, after its own user namespace
        cfg["layers"] = layers
        argv += [interp.exe, "-I", "-S", "-B", *harness_args(False), json.dumps(cfg)]
        return Launch(argv, {"PATH": "/usr/bin:/bin"}, None, [], info_fd=True, seccomp=prog if self.root else None)


class Legacy:
    name = "legacy"

    def __init__(self) -> None:
        self.root = os.geteuid() == 0

    def launch(self, cfg: dict, uid: int | None, limits: SandboxLimits, program: str | None, extra: tuple[str, ...] = ()) -> Launch:
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
                   tmp_opts=f"size={int(limits.tmp_bytes)},nr_inodes={int(limits.tmp_inodes)},mode=0700",
                   proc_masks=_PROC_MASKS, proc_dir_masks=_PROC_DIR_MASKS,
                   prefix_usable=_world_usable(interp.exe) and _world_usable(os.path.join(interp.prefix, "lib")),
                   seccomp=prog.hex() if prog is not None else None, layers=["process", "env", "timeout", *extra])
        argv = [interp.exe, "-I", "-S", "-B", *harness_args(True), json.dumps(cfg)]
        return Launch(argv, _clean_env(workdir), workdir, [workdir], pidns_waiter=limits.namespaces)


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


def poll_ready(read: list[int], write: list[int], timeout: float) -> tuple[set[int], set[int]]:
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


class Running:
    """A started sandbox, and the one way to end it that leaves neither processes nor zombies.

    SIGKILLing bwrap itself would orphan the sandbox's init (--die-with-parent
    kills it, but its zombie goes to the host's PID 1, which in a trainer's
    container may never reap). So the init is killed first (its host pid comes
    from bwrap's --info-fd; the kernel then kills and reaps everything in the
    namespace) and bwrap, still alive, reaps it and exits. The legacy backend's
    root waiter does the same on SIGTERM. SIGKILL of the process group is the
    fallback.
    """

    def __init__(self, launch: Launch, **kw) -> None:
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
            ready, _ = poll_ready([self._info], [], max(0.0, deadline - time.monotonic()))
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


def start_sandbox(impl, memcg: MemCgroups | None, role: str, limits: SandboxLimits, deadline: float,
                  program: str | None = None, reset_peak: bool = False, **popen) -> tuple[Lease, Launch, Running]:
    """Lease a slot (and its memory cgroup), build the launch, start it; frees what it took if that fails."""
    lease = Lease(impl.root, memcg, limits, deadline)
    launch = None
    try:
        if reset_peak and memcg is not None and lease.procs:
            memcg.reset_peak(lease.name)
        launch = impl.launch(_rlimit_cfg(role, limits), lease.uid, limits, program, ("memcg",) if lease.procs else ())
        launch.cgroup_procs = lease.procs
        return lease, launch, Running(launch, **popen)
    except BaseException:
        for d in launch.cleanup if launch else ():
            shutil.rmtree(d, ignore_errors=True)
        lease.release()
        raise
