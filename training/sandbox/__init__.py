"""Run untrusted Python (model-written code) in a contained child process.

Used by the code verifier (`mentor.training.code_verify`): HumanEval-style
tests run as two sandboxes, a *worker* holding the candidate's code and a
*tester* holding the tests, which only exchange plain data through the caller
(see that module for the pass protocol); stdin/stdout cases run as one
*program* sandbox each (`run_python`). The code inside every sandbox is
the harness source (`harness` and the files pasted before it, plus
`plaincodec`); docs/sandbox.md has the threat model.

This package is the sandbox, one module per part: `layers` (the layers a run
reports, what a missing one means, `SandboxLimits`), `slots` (slot uids and the
lease a running sandbox holds), `cgroups` (its memory cgroup), `seccomp` (the
syscall filter), `view` (the RAM copy of what a sandbox reads), `launch` (the
interpreter and harness it runs, each backend's launch, ending it cleanly),
`pipes` (a program's pipes), `process` (the worker/tester message channel,
`SandboxProcess`); the harness source: `harness_channel`, `harness_tester`,
`harness_probe`, `harness`, and `harness_legacy` for the legacy backend. This
module, the package's face (``from mentor.training.sandbox import run_python``),
chooses the backend (probed once per process: `backend`), warns about missing
layers (`check_layers`) and runs one program (`run_python`): it stays here,
not in a module of its own, so that the backend it holds is the one every
caller (and a test that swaps it) sees.

Backends
--------
``bwrap`` (the default where it works): bubblewrap builds the sandbox from
nothing: new PID, network, IPC, UTS and cgroup namespaces; a root filesystem
that holds only the interpreter, its standard library (no ``site-packages``)
and the system libraries they load, taken from a copy in RAM
(`view`: no page cache of a disk for sandboxes to share), a private
``/proc`` and minimal ``/dev``, all read-only, plus an empty tmpfs ``/tmp`` as
the work dir; ``--die-with-parent``, ``--new-session``, a clean environment.
Started as root, bwrap keeps only CAP_SETUID/SETGID/SETPCAP/SYS_ADMIN for the
harness's first steps (`harness.drop_privileges`, trusted code, before
it reads anything): it mounts /tmp with a size *and* an inode limit, remounts
/proc with only the sandbox's own processes in it (no other uid's key quotas or
locks, none of the host's cumulative counters such as /proc/stat's fork
count), empties every capability set, sets no_new_privs and switches real,
effective and saved uid/gid to the run's own *slot uid*, and checks all of it
before going on. bwrap loads the syscall filter (`seccomp_filter`, on
``--seccomp FD``) before it execs anything. The launcher
enters the sandbox's memory cgroup (`MemCgroups`) before exec'ing bwrap. The
copy keeps every file at its own path, in directories (``/root`` included)
that are 0755, so a pyenv Python under /root (0700 on the host) runs as the
slot uid while nothing else of /root exists inside. Started as a normal user,
bwrap uses a user namespace in which the harness starts as uid 0 (``--uid 0``,
owning the sandbox's mounts): it mounts /tmp and remounts /proc the same way,
then takes the user's own (unprivileged) uid in a user namespace of its own,
drops every capability and loads the filter itself.

``legacy`` (no bubblewrap, or it cannot create namespaces here): the previous
hand-written layers, see `harness_legacy`: unshare(2) namespaces, the whole
filesystem remounted read-only except the work dir, the interpreter exposed to
the slot uid, the same syscall filter and memory cgroup, an audit-hook
tripwire, and a work dir that is a tmpfs limited in bytes and inodes. It lacks
``fsview`` and ``ramview``: the code can read world-readable files, and their
cache. Used with a warning; ``MENTOR_SANDBOX=bwrap|legacy`` forces a backend.

Guarantees (bwrap, defaults): the code cannot outlive the wall-clock limit or
its CPU limit, allocate more than the address-space limit per process or the
memory cgroup's limit in all, start more processes than
`SandboxLimits.processes` (1 for worker and tester: no fork, no threads),
reach any network (or open any socket but a unix one), see other processes, read the caller's environment or any
file but the interpreter, its standard library and their libraries, write
anything but its tmpfs, keep processes or any other state (keys, files, locks,
pages of a disk's cache, the host's fork count, socket cookies, unique mount ids, eventfd ids,
the host's memory counts and load average)
after the run, take the host's disk through its stdin/stdout/stderr (pipes), or signal
another sandbox through a lock or a watch on a shared file. Not
guaranteed: protection from kernel exploits (it shares the host kernel) and
from CPU/memory-bandwidth contention and timing side channels. For hostile
workloads at scale run the verifier behind a VM/container sandbox service (see
`code_verify`'s runner seam).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mentor.training.sandbox.cgroups import MemCgroups
from mentor.training.sandbox.launch import Bwrap, Legacy, interpreter, start_sandbox
from mentor.training.sandbox.layers import (
    LAYER_MEANING,
    REQUIRED_LAYERS,
    SandboxLimits,
    SandboxUnavailable,
    identity_ok,
)
from mentor.training.sandbox.pipes import run_program
from mentor.training.sandbox.seccomp import seccomp_filter

log = logging.getLogger(__name__)

_MARK = "\x00MENTOR-SANDBOX-LAYERS "


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


# --------------------------------------------------------------------------- the backend


def probe_backend(impl, memcg: MemCgroups | None = None) -> tuple[list[str], dict] | None:
    """Run the probe role once: (layers, facts), or None when the backend does not start here."""
    lease = launch = None
    try:
        # The slot's peak is reset first (v1), so that a charge seen afterwards is this probe's.
        lease, launch, running = start_sandbox(impl, memcg, "probe", SandboxLimits(), time.monotonic() + 30, reset_peak=True,
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


def verified_layers(layers: list[str], facts: dict) -> list[str]:
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
    if len(facts.get("proc_pids", [])) > 3 or facts.get("key_users") or facts.get("proc_stat", True):
        ok -= {"procns"}
    # Each of these must have failed inside: they are what the filter is for.
    if any(facts.get(k, True) for k in ("keyring", "flock", "memfd", "shm", "userns", "fadvise", "nowait", "sockbuf", "pidfd",
                                              "netlink", "inet", "eventfd", "statx")):
        ok -= {"seccomp"}
    if facts.get("disk_mounts", True):
        ok -= {"ramview"}
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
    seen = probe_backend(impl, memcg)
    if seen is None and memcg is not None:
        why = f"the sandbox does not start inside a memory cgroup of {memcg.base}"
        memcg, seen = None, probe_backend(impl, None)
    if seen is None:
        return None
    layers = verified_layers(*seen)
    missing: dict[str, str] = {}
    if "memcg" not in layers:
        missing["memcg"] = why or "nothing was charged to the sandbox's memory cgroup"
        memcg = None
    if "seccomp" not in layers:
        missing["seccomp"] = (f"no syscall filter for this CPU ({platform.machine()})" if seccomp_filter() is None
                              else "the syscall filter did not hold in the probe")
    if "tmpcap" not in layers:
        missing["tmpcap"] = ("the harness could not mount /tmp with an inode limit"
                             if getattr(impl, "name", "") == "bwrap" else "the legacy backend's work dir could not be a tmpfs of its own")
    if "ramview" not in layers:
        if getattr(impl, "name", "") != "bwrap":
            missing["ramview"] = "the legacy backend reads the host's files"
        else:
            missing["ramview"] = getattr(impl, "view_why", "") or "the probe saw a disk-backed directory in the sandbox"
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
                chosen = backend_for(Bwrap(path))
            if chosen is None:
                why = "bubblewrap is not installed (apt-get install bubblewrap)" if not path else "bubblewrap cannot create its namespaces here"
                if want == "bwrap" or strict():
                    raise SandboxUnavailable(f"mentor sandbox: {why}")
                log.warning("mentor sandbox: %s; falling back to the legacy layers", why)
        if chosen is None:
            impl = Legacy()
            chosen = backend_for(impl) or Backend(impl, [], {})
        _BACKEND = chosen
        return chosen


def check_layers(layers: list[str], where: str = "") -> None:
    """Warn once per process about each missing required layer; raise in strict mode."""
    missing = [layer for layer in REQUIRED_LAYERS if layer not in layers]
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


# --------------------------------------------------------------------------- one program


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as ``main.py`` (``__name__ == "__main__"``) in a fresh sandbox; never raises for anything the code does.

    Raises `SandboxUnavailable` only before running anything (strict mode, no free slot).
    Its stdin, stdout and stderr are pipes to this process (`pipes.run_program`: nothing of
    the host's disk is handed to the program); of its output the first `max_output` bytes are kept,
    and a stream that passes `SandboxLimits.file_bytes` is closed on it.
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
        lease, launch, running = start_sandbox(be.impl, be.memcg, "program", limits, start + 60, str(main),
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc = running.proc
        try:
            deadline = time.monotonic() + limits.wall_seconds
            got = run_program(proc, stdin.encode("utf-8"), deadline, limits.max_output, limits.max_output + 4096,
                              limits.file_bytes)
            timed_out = got.timed_out
            if not timed_out:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            running.end()  # always: kills leftovers even after a clean exit
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        duration = time.monotonic() - start
        stdout, out_cut = got.stdout[:limits.max_output].decode("utf-8", "replace"), len(got.stdout) > limits.max_output
        stderr = got.stderr[:limits.max_output + 4096].decode("utf-8", "replace")
        err_cut = len(got.stderr) > limits.max_output + 4096
        layers: list[str] = []
        ident: dict = {}
        if stderr.startswith(_MARK):
            first, _, stderr = stderr.partition("\n")
            try:
                info = json.loads(first[len(_MARK):])
                layers, ident = list(info["layers"]), info["id"]
            except (ValueError, KeyError, TypeError):
                layers = []
        if layers and not identity_ok(ident):
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


def layers_here() -> list[str]:
    """The layers a run on this machine gets (probed once per process)."""
    return list(backend().layers)


__all__ = [
    "Backend",
    "SandboxResult",
    "backend",
    "backend_for",
    "check_layers",
    "layers_here",
    "run_python",
    "strict",
]
