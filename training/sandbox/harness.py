"""The program that runs INSIDE each sandbox (standard library only).

`mentor.training.sandbox.launch` starts ``python -I -S -B -c SOURCE CONFIG`` where
SOURCE is `mentor.training.plaincodec`, then `harness_channel` (the message
channel, `identity`), `harness_tester` (the tester role), `harness_probe` (the
probe role) and last this file (its setup, the program and worker roles and
`main`), pasted one after the other (`launch.harness_source`; or, when the
sandbox runs the caller's own interpreter, the same code compiled once by the
caller and passed marshalled: `launch.harness_args`), so nothing in them may
import mentor: each imports the others' names only when it is imported as a
module (tests, tools). CONFIG (JSON, argv[1]) names the role and the rlimits; it
holds nothing secret. Roles:

``program``  run a stdin/stdout program (``/sandbox/main.py``, or ``main.py`` in
             the work dir) as ``__main__``; its output is compared by the caller.
``worker``   load the candidate's code as module ``solution``, then answer
             the tester's ``{"call": {"a": args, "k": kwargs}}`` messages
             (relayed unparsed by the caller) with ``{"ok": result}`` (plain
             data only) or ``{"raised": name, "msg": text}``. The candidate's
             own prints go to /dev/null.
``tester``   run the trusted setup (the task's prompt) and tests with
             ``candidate`` bound to a proxy whose calls are forwarded to the
             worker through the caller, and report ``{"done": "pass",
             "nonce": N}`` only once ``check(candidate)`` has returned with
             no failure recorded. The tests are compiled so that a failing
             ``assert`` (or a failing statement of ``check``) is *recorded*
             and the run goes on, and short-circuiting expressions evaluate
             every operand (`recording_tests`): every test call is made
             whatever the candidate answered, so the calls the worker sees
             never tell it whether an earlier answer passed (no answer oracle).
             It decodes the worker's replies (relayed unparsed by the caller)
             strictly, and fails the check itself on one that is not plain data.
``probe``    report what this process can see and do (used once per process
             to check that the layers hold).

Every role first sets the rlimits and sends a ``hello`` with its uid, effective
capabilities and no_new_privs flag, before any untrusted code runs; the caller
refuses to go on if the uid is 0. Messages are one JSON object per line on the
original stdin/stdout (the worker and tester move them to private fds and put
/dev/null on 0/1, so a stray ``print`` cannot break the framing; after the
hello fd 2 is /dev/null too, so a stderr flood costs the caller nothing).

In the legacy backend (no bubblewrap) `legacy_setup` (`harness_legacy`'s
source, pasted before this file) first builds what layers the kernel allows
here: namespaces via unshare(2), a read-only filesystem, the uid drop, and an
audit hook that is a tripwire only (see the sandbox module).
"""

import builtins
import json
import os
import resource
import sys

try:  # inside the sandbox the sources pasted before this one (plaincodec, harness_channel, ...) define these
    from_plain, to_plain, PlainError, first_message, identity, describe, exc_name, role_tester, role_probe  # noqa: B018
except NameError:  # imported as a module (tests, tools): never inside a sandbox, where nothing may import mentor
    from mentor.training.plaincodec import PlainError, from_plain, to_plain
    from mentor.training.sandbox.harness_channel import describe, exc_name, first_message, identity
    from mentor.training.sandbox.harness_probe import role_probe
    from mentor.training.sandbox.harness_tester import role_tester


def set_rlimits(cfg):
    pairs = [
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_NPROC, cfg["processes"]),
        (resource.RLIMIT_NOFILE, cfg["open_files"]),
        (resource.RLIMIT_CORE, 0),
        # Kernel objects outside any fd: queued signals and POSIX timers (96,368 timers here pinned
        # 37 MiB of slab), POSIX message queues.
        (resource.RLIMIT_SIGPENDING, 64),
        (resource.RLIMIT_MSGQUEUE, 0),
    ]
    ok = True
    for res, value in pairs:
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            ok = False
    return ok


def _libc():
    """mount, prctl and capset of the C library through `_ctypes` alone: importing `ctypes` would cost every
    sandbox 3 ms of CPU, `_ctypes` 0.6 ms."""
    import _ctypes  # at use: only drop_privileges needs it

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class ULong(_ctypes._SimpleCData):
        _type_ = "L"

    class CharP(_ctypes._SimpleCData):
        _type_ = "z"

    class U32(_ctypes._SimpleCData):
        _type_ = "I"

    class Caps(_ctypes.Array):  # a capability header (2 words) or the data of its two halves (6 words)
        _type_ = U32
        _length_ = 6

    class Lib:
        _handle = _ctypes.dlopen(None, 0)

    class Fn(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    def fn(name, *args):
        f = Fn((name, Lib()))
        f.argtypes = args
        return f

    return (fn("mount", CharP, CharP, CharP, ULong, CharP), fn("prctl", Int, ULong, ULong, ULong, ULong),
            fn("capset", Caps, Caps), Caps, fn("unshare", Int))


def hide_proc(mount, cfg):
    """This /proc shows its own processes only (``subset=pid``, Linux 5.8): no other uid's key quotas or
    locks, and none of the host's cumulative counters that a run could move and a later run read back
    (/proc/stat's fork count...). Older kernels: /dev/null over each of them. True when it held."""
    if mount(b"proc", b"/proc", b"proc", 32 | 2 | 4 | 8, b"subset=pid") == 0:  # MS_REMOUNT|NOSUID|NODEV|NOEXEC
        return True
    files = [mount(b"/dev/null", p.encode(), None, 4096, None) == 0 for p in cfg.get("proc_masks", ()) if os.path.exists(p)]
    dirs = [mount(b"tmpfs", p.encode(), b"tmpfs", 1, b"mode=0555") == 0 for p in cfg.get("proc_dir_masks", ()) if os.path.isdir(p)]
    return all(files) and all(dirs)


def drop_privileges(drop, layers):
    """bwrap as root: mount /tmp (a tmpfs limited in bytes *and* inodes, which bwrap's own --tmpfs cannot
    be), hide /proc's global files (`hide_proc`), then become the run's slot uid with no capability left in
    any set and no_new_privs, and check it (``mount(8)`` and ``setpriv`` did this in three more execs per
    sandbox). Only trusted code has run until here; the run stops if any step fails (code never runs as
    root).

    bwrap as a normal user (``drop["ids"]``: the caller's uid and gid): the same mounts, made as root of
    bwrap's user namespace (``--uid 0``, which owns the sandbox's mounts), then `_own_userns` leaves that
    uid 0 for the caller's own uid in a user namespace of its own (what bwrap itself does, there without
    the mounts), with every capability dropped the same way."""
    mount, prctl, capset, caps, unshare = _libc()
    uid = gid = drop.get("uid")
    if mount(b"tmpfs", b"/tmp", b"tmpfs", 2 | 4, drop["tmp"].encode()) != 0:  # MS_NOSUID | MS_NODEV
        os.write(2, b"mentor sandbox: cannot mount /tmp\n")
        os._exit(125)
    os.chdir("/tmp")
    hide_proc(mount, drop)
    if uid is None:
        uid, gid = _own_userns(unshare, drop["ids"])
    for cap in range(64):
        prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
    if drop.get("uid") is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from uid 0 to another: the kernel clears the permitted and effective sets
    capset(caps(0x20080522, 0), caps())  # _LINUX_CAPABILITY_VERSION_3, this process: the inheritable set too
    prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    # A uid change without an exec leaves the process non-dumpable, its /proc/self root's (no
    # /proc/self/fd or io for it): dumpable again, as it is after an exec.
    prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    with open("/proc/self/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    if (any(int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
            or int(status["NoNewPrivs"]) != 1 or os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3):
        os.write(2, b"mentor sandbox: the privileges did not drop\n")
        os._exit(125)
    return layers + ["tmpcap"]


def _own_userns(unshare, ids):
    """From uid 0 of bwrap's user namespace (the caller's uid outside) to the caller's own uid and gid in a
    new user namespace, mapped to that uid 0 and nothing else; the (uid, gid) it now has."""
    uid, gid = int(ids[0]), int(ids[1])
    if unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os.write(2, b"mentor sandbox: cannot leave the setup's user namespace\n")
        os._exit(125)
    for name, text in (("setgroups", "deny"), ("uid_map", "%d 0 1" % uid), ("gid_map", "%d 0 1" % gid)):
        with open("/proc/self/" + name, "w") as fh:
            fh.write(text)
    return uid, gid


def install_seccomp(hexprog):
    """Load the classic-BPF filter `hexprog` (``struct sock_filter[]``) for this process and its children."""
    import ctypes  # only when the filter is installed here (legacy backend; bwrap as a normal user)

    prog = bytes.fromhex(hexprog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to load a filter without CAP_SYS_ADMIN
        return False
    return libc.prctl(22, 2, ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p), 0, 0) == 0  # PR_SET_SECCOMP, FILTER



# --------------------------------------------------------------------------- roles


def role_program(cfg, layers):
    path = cfg.get("main") or "main.py"
    with open(path, "rb") as fh:
        src = fh.read()
    sys.stderr.write("\x00MENTOR-SANDBOX-LAYERS " + json.dumps({"layers": layers, "id": identity()}) + "\n")
    sys.stderr.flush()
    sys.argv = ["main.py"]
    g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    exec(compile(src, "main.py", "exec"), g)


def role_worker(cfg, layers):
    import types  # at use: each role imports what it alone needs (every sandbox pays for its imports)

    chan, init = first_message(layers)
    if init is None:
        return
    mod = types.ModuleType("solution")
    mod.__dict__["__builtins__"] = builtins
    sys.modules["solution"] = mod
    try:
        exec(compile(init.get("prelude", "") + init["code"], "solution.py", "exec"), mod.__dict__)
        owner, _, method = init["entry"].partition(".")
        fn = mod.__dict__.get(owner)
        if method:  # LeetCode style: the method of one instance, as LiveCodeBench's grader calls it
            fn = getattr(fn(), method, None) if isinstance(fn, type) else None
        if not callable(fn):
            chan.send({"error": "the code defines no function named %r" % init["entry"]})
            return
    except BaseException as exc:  # the candidate's code failed to load: report it, stop
        chan.send({"error": describe(exc)})
        return
    chan.send({"ready": True})
    while True:
        msg = chan.recv()  # the tester's call, relayed as it wrote it
        if msg is None:
            return
        args, kwargs = from_plain(msg["call"]["a"]), from_plain(msg["call"]["k"])
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # SystemExit too: it is the call's outcome, not ours
            chan.send({"raised": exc_name(exc), "msg": describe(exc)})
            continue
        try:
            chan.send({"ok": to_plain(result)})
        except (PlainError, ValueError, TypeError, RecursionError) as exc:
            chan.send({"bad": str(exc)[:200]})



ROLES = {"program": role_program, "worker": role_worker, "tester": role_tester, "probe": role_probe}


def main():
    cfg = json.loads(sys.argv[1])
    layers = list(cfg.get("layers", []))
    if cfg.get("legacy"):
        layers = legacy_setup(cfg, layers)  # noqa: F821 - defined in harness_legacy's source
    elif cfg.get("drop"):
        layers = drop_privileges(cfg["drop"], layers)
    if set_rlimits(cfg):
        layers.append("rlimits")
    if os.getuid() == 0 or os.geteuid() == 0:
        sys.stderr.write("mentor sandbox: refusing to run code as uid 0\n")
        os._exit(125)
    # bwrap as root hands the filter over itself (--seccomp); the legacy backend and bwrap as a normal user
    # (whose harness needs a user namespace of its own first) load it here, before any untrusted code.
    if cfg.get("seccomp") and install_seccomp(cfg["seccomp"]):
        layers.append("seccomp")
    if cfg.get("legacy") and cfg.get("audit") and cfg["role"] != "probe":  # the probe observes the kernel's layers
        install_audit_hook(os.path.realpath(os.getcwd()), cfg)  # noqa: F821
        layers.append("audit")
    ROLES[cfg["role"]](cfg, layers)
