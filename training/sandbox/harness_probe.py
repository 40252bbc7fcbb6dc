"""Harness source: the probe role, which reports what a sandbox can see and do.

Run once per process by the caller (`sandbox.backend`) to check that the layers hold before any code
is checked. Pasted after `harness_channel`'s source into the program every sandbox runs
(`launch.harness_source`), standard library only: nothing here may import mentor.
"""

import json
import os
import sys

try:  # inside the sandbox the sources pasted before this one define it
    identity  # noqa: B018
except NameError:  # imported as a module (tests, tools): never inside a sandbox, where nothing may import mentor
    from mentor.training.sandbox.harness_channel import identity


def role_probe(cfg, layers):
    import socket  # at use: only the probe needs it

    facts = identity()
    facts["root_listing"] = sorted(os.listdir("/"))
    facts["proc_pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
    try:
        with open("/etc/shadow", "rb"):
            facts["shadow_readable"] = True
    except OSError:
        facts["shadow_readable"] = False
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:  # the filter allows AF_UNIX sockets only
        facts["route"] = False
    else:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            facts["route"] = True
        except OSError:
            facts["route"] = False
        finally:
            s.close()
    facts.update(_probe_state(cfg))
    sys.stdout.write(json.dumps({"layers": layers, "facts": facts}) + "\n")


def _worked(f):
    try:
        f()
        return True
    except OSError:
        return False


def _probe_state(cfg):
    """What the syscall filter, the /proc masks and the /tmp mount must forbid: True where it worked."""
    import ctypes  # at use: only the probe needs these
    import fcntl  # likewise
    import socket  # likewise

    libc = ctypes.CDLL(None, use_errno=True)
    nr = cfg.get("nr") or {}
    out = {}
    try:
        with open("/proc/key-users") as fh:
            out["key_users"] = bool(fh.read().strip())
    except OSError:
        out["key_users"] = False
    # A key in the process keyring (-2) dies with this process, whatever happens.
    out["keyring"] = "add_key" not in nr or libc.syscall(nr["add_key"], b"user", b"mentor-probe", b"x", 1, -2) >= 0
    try:
        with open(os.__file__, "rb") as fh:  # a file every sandbox shares
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        out["flock"] = True
    except OSError:
        out["flock"] = False
    try:
        os.close(os.memfd_create("mentor-probe"))
        out["memfd"] = True
    except (OSError, AttributeError):
        out["memfd"] = False
    shm = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    out["shm"] = shm >= 0
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    # The page cache of a shared file, socket buffers past the default, host-wide counters.
    with open(os.__file__, "rb") as fh:
        out["fadvise"] = _worked(lambda: os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED))
        out["nowait"] = _worked(lambda: os.preadv(fh.fileno(), [bytearray(16)], 0, os.RWF_NOWAIT))
    out["sockbuf"] = _worked(lambda: socket.socket(socket.AF_UNIX).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20))
    out["pidfd"] = _worked(lambda: os.close(os.pidfd_open(os.getpid())))
    # Host-wide ids (issue 58): sockets of other families (netlink's sock_diag and its port ids, TCP's
    # count), eventfd ids, the unique mount id of statx.
    out["netlink"] = _worked(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close())
    out["inet"] = _worked(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
    out["eventfd"] = _worked(lambda: os.close(os.eventfd(0)))
    out["statx"] = "statx" not in nr or libc.syscall(nr["statx"], -100, b"/", 0, 0x4000, ctypes.create_string_buffer(256)) == 0
    try:
        with open("/proc/stat") as fh:
            out["proc_stat"] = bool(fh.read().strip())
    except OSError:
        out["proc_stat"] = False
    out["tmp_opts"], out["disk_mounts"] = [], []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                f, fstype = line.split(), line.partition(" - ")[2].split()[:1]
                if len(f) > 4 and f[4] == os.getcwd():  # its writable dir: /tmp (bwrap), the work dir (legacy)
                    out["tmp_opts"] = [o.split("=")[0] for o in line.rsplit(" ", 1)[-1].strip().split(",")]
                # What it can read must not come from a disk's page cache (files bound over /proc aside).
                if len(f) > 4 and os.path.isdir(f[4]) and fstype and fstype[0] not in ("tmpfs", "proc", "devpts", "mqueue"):
                    out["disk_mounts"].append(f[4])
    except OSError:
        pass
    out["userns"] = libc.unshare(0x10000000) == 0  # last: it changes what this process is
    return out

