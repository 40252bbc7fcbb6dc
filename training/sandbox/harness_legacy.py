"""Harness source, never imported: the fallback (legacy) sandbox layers, for machines without a working bubblewrap.

`launch.harness_source` pastes this file's text between `plaincodec`'s and
`harness`'s into the program the legacy backend runs; `harness` calls
its `legacy_setup` (standard library only). It runs inside the sandboxed interpreter,
before `harness`'s role, as root or as the calling user: nothing here may
import mentor. In order:

1. namespaces via unshare(2): network, PID and mount (as root directly; as a
   normal user inside a new user namespace, where the kernel allows it);
2. in the mount namespace: the interpreter made reachable for the sandbox uid
   (`_expose`: when its prefix sits under a directory that uid cannot enter,
   such as /root at 0700, that directory is covered by an empty tmpfs holding
   only a bind mount of the prefix, so the rest of it stays hidden), then the
   work dir made a tmpfs limited in bytes and inodes (holding the files it
   had), every other mount remounted read-only, and a /proc of the new PID
   namespace with the cross-uid views and the host's cumulative counters masked;
3. fork into the PID namespace (the child is its init: when it ends the kernel
   kills everything it started); parent-death signal SIGKILL;
4. as root: the bounding set emptied, no_new_privs, and the real, effective and
   saved uid/gid set to the run's own unprivileged uid (a slot uid, see
   `slots`), so files readable only by root stay unreadable and
   RLIMIT_NPROC counts only this run's processes. If that uid could not run
   the interpreter, the run stops here: code never runs as uid 0. As a normal
   user: its own uid, with every capability of its user namespace dropped.

What it cannot give, and bubblewrap does: a filesystem view holding only the
interpreter and system libraries, copied in RAM. Here the code sees the whole
(read-only) filesystem, so it can read world-readable files, datasets with
tests included, and time whether their pages are cached. `sandbox` warns
about that (layers ``fsview`` and ``ramview`` missing) and refuses in strict mode.

`install_seccomp` (in `harness`) loads the same syscall filter the bwrap backend hands to
``bwrap --seccomp`` (built by the caller, passed as hex in the config): no
keyrings, file locks, inotify/fanotify, memfd/SysV IPC, io_uring, bpf, perf
events, userfaultfd, new user namespaces, page-cache calls, large socket or
pipe buffers, pidfds or socket cookies (`seccomp`). It is installed after the uid drop
and before any untrusted code, with no_new_privs set, and is inherited by
everything the code starts; it cannot be removed.

`install_audit_hook` adds a PEP 578 hook that refuses sockets, exec, ctypes,
fork, kill and writes outside the work dir. It is a tripwire, not a boundary:
hostile code can get at it (the garbage collector, a cell or list it holds, a
patched ``os.path``). Its state is bound at creation (default arguments
holding frozensets; no module globals, nothing in ``__main__``) and it refuses
writes to its own attributes and to any function's ``__code__``, so the
one-line switch-offs that worked before no longer do, but no guarantee rests
on it.
"""

import os
import signal


def legacy_setup(cfg, layers):
    import ctypes  # imported where it is used, as throughout the harness source

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = (
        1, 2, 4, 8, 32, 4096, 8192, 16384, 1 << 18)
    root = os.geteuid() == 0
    uid = cfg.get("uid")
    workdir = os.path.realpath(os.getcwd())

    def mount(src, dst, fstype, flags, data=None):
        return libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags,
                          data and ctypes.c_char_p(data.encode())) == 0

    ns = []
    if cfg.get("namespaces", True):
        base = 0 if root else CLONE_NEWUSER
        ids = os.getuid(), os.getgid()
        names = {CLONE_NEWNET: "netns", CLONE_NEWPID: "pidns", CLONE_NEWNS: "mountns"}
        for extra in (CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS, CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET):
            if libc.unshare(base | extra) == 0:
                ns = [n for flag, n in names.items() if extra & flag]
                break
        if ns and not root:
            # Its own uid and gid mapped onto themselves: unmapped, every file it owns reads as another
            # uid's (65534) and opening one failed with EOVERFLOW, so no run started here.
            for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (ids[0], ids[0])),
                               ("gid_map", "%d %d 1" % (ids[1], ids[1]))):
                with open("/proc/self/" + name, "w") as fh:
                    fh.write(text)
    exposed = False
    if "mountns" in ns:
        ns.remove("mountns")
        if mount("none", "/", None, MS_REC | MS_PRIVATE):
            if root and uid is not None:
                exposed = _expose(cfg["prefix"], workdir, uid, mount, MS_BIND | MS_REC, MS_MOVE)
            ro, capped = _readonly_filesystem(workdir, mount, MS_REMOUNT | MS_BIND | MS_RDONLY, MS_BIND | MS_REC,
                                              cfg.get("tmp_opts"), uid if root else None)
            ns += ["fsro"] * ro + ["tmpcap"] * capped
    layers += ns

    if "pidns" in ns:
        alive_r, alive_w = os.pipe()  # EOF on alive_r once the launcher is gone
        pid = os.fork()
        if pid:
            os.close(alive_r)
            signal.signal(signal.SIGTERM, lambda *a: os.kill(pid, signal.SIGKILL))
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
        if "fsro" in ns and mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC):
            # Other uids' key quotas, the system's locks and the host's cumulative counters, visible through
            # any /proc: hidden (`hide_proc`, in harness).
            def c_mount(src, dst, fstype, flags, data):  # hide_proc's mount: bytes in, 0 on success
                return 0 if mount(src and src.decode(), dst.decode(), fstype and fstype.decode(), flags, data and data.decode()) else -1

            if hide_proc(c_mount, cfg):  # noqa: F821 - defined in harness's source
                layers.append("procns")

    if root:
        if uid is None or not (exposed or cfg.get("prefix_usable")):
            os.write(2, b"mentor sandbox: no unprivileged uid can run this interpreter here; refusing to run as root\n")
            os._exit(125)
        PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from uid 0 to another: the kernel clears every capability
        layers += ["uid", "nocaps"]
    else:
        # A normal user's own uid: unprivileged for real. Inside a new user namespace it holds every
        # capability over that namespace; give them up too.
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        layers.append("uid")
        if libc.capset(header, (ctypes.c_uint32 * 6)()) == 0:
            layers.append("nocaps")
    if "pidns" in ns:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG, after setuid (which clears it)
        os.close(alive_w)
        import select  # only this PID-namespace step needs it

        if select.select([alive_r], [], [], 0)[0]:
            os._exit(137)  # the launcher died before the signal was armed
        os.close(alive_r)
        if uid is not None or not root:
            layers.append("nproc")  # the PID namespace plus RLIMIT_NPROC of a uid of its own
    return layers


def _world_usable(path):
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def _expose(prefix, workdir, uid, mount, bind_rec, move):
    """Make `prefix` reachable for `uid` without exposing its private parent directory."""
    if _world_usable(prefix):
        return True
    blocked, p = None, os.path.realpath(prefix)
    while p != "/":
        p = os.path.dirname(p)
        if not os.stat(p).st_mode & 0o001:
            blocked = p  # the topmost such directory wins
    if blocked is None:
        return False
    stash = os.path.join(workdir, ".mentor-python")
    os.mkdir(stash, 0o755)
    ok = (mount(prefix, stash, None, bind_rec)
          and mount("tmpfs", blocked, "tmpfs", 0, "mode=0755,size=64k"))
    if ok:
        os.makedirs(prefix, 0o755, exist_ok=True)
        ok = mount(stash, prefix, None, move)
    try:
        os.rmdir(stash)
    except OSError:
        pass
    return ok and _world_usable(prefix)


def _readonly_filesystem(workdir, mount, remount_ro, bind_rec, tmp_opts, uid):
    """Every mount read-only except the work dir, which becomes a tmpfs limited in bytes and inodes holding
    the files it had (else it stays the host's directory, bound onto itself): (all read-only, capped)."""
    keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
    files = {}
    for name in os.listdir(workdir):
        path = os.path.join(workdir, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as fh:
                files[name] = fh.read()
    owner = ",uid=%d,gid=%d" % (uid, uid) if uid is not None else ""
    capped = bool(tmp_opts) and mount("tmpfs", workdir, "tmpfs", keep["nosuid"] | keep["nodev"], tmp_opts + owner)
    if capped:
        for name, data in files.items():
            with open(os.path.join(workdir, name), "wb") as fh:
                fh.write(data)
            if uid is not None:
                os.chown(os.path.join(workdir, name), uid, uid)
    elif not mount(workdir, workdir, None, bind_rec):
        return False, False
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
        flags = remount_ro | sum(keep.get(o, 0) for o in f[5].split(","))
        if not mount(None, point, None, flags) and not point.startswith(("/proc", "/sys", "/dev")):
            ok = False
    os.chdir(workdir)  # the old cwd is the directory under the mount (now read-only)
    return ok, capped


def install_audit_hook(workdir, cfg):
    """A tripwire (see the module docstring); every name it uses is bound here, at creation."""
    import sys  # imported where it is used, as throughout the harness source

    blocked = frozenset({
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg", "os.exec", "os.spawn", "os.system",
        "os.posix_spawn", "os.forkpty", "os.fork", "subprocess.Popen", "pty.spawn", "ctypes.dlopen",
        "ctypes.dlsym", "ctypes.addressof", "ctypes.cdata", "ctypes.call_function", "os.setxattr",
        "os.removexattr", "os.chflags", "os.putenv", "os.kill", "os.killpg", "signal.pthread_kill",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    })
    path_writes = frozenset({
        "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.mkdir",
        "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree",
    })
    modules = frozenset({"_posixsubprocess", "_ctypes", "_xxsubinterpreters"})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    prefix = workdir + "/"

    def hook(event, args, blocked=blocked, path_writes=path_writes, modules=modules, write_flags=write_flags,
             workdir=workdir, prefix=prefix, fsdecode=os.fsdecode, abspath=os.path.abspath,
             str_=str, bytes_=bytes, int_=int, isinstance_=isinstance, PermissionError_=PermissionError,
             any_=any, me=[]):
        if event in blocked:
            raise PermissionError_("mentor sandbox: " + event + " is not allowed")
        if event == "object.__setattr__" and (args[0] is me[0] or args[1] == "__code__"):
            raise PermissionError_("mentor sandbox: changing this function is not allowed")
        if event == "import" and args[0] in modules:
            raise PermissionError_("mentor sandbox: importing " + str_(args[0]) + " is not allowed")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance_(path, int_):
                return
            writing = (isinstance_(mode, str_) and any_(c in mode for c in "wax+")) or (
                isinstance_(flags, int_) and flags & write_flags)
            p = abspath(fsdecode(path))
            if p.startswith("/proc/") and not p.startswith("/proc/self/"):
                raise PermissionError_("mentor sandbox: reading " + p + " is not allowed")
            if writing and p != workdir and not p.startswith(prefix) and p != "/dev/null":
                raise PermissionError_("mentor sandbox: writing " + p + " is not allowed")
        elif event in path_writes:
            for a in args[:2]:
                if isinstance_(a, (str_, bytes_)):
                    p = abspath(fsdecode(a))
                    if p != workdir and not p.startswith(prefix):
                        raise PermissionError_("mentor sandbox: " + event + " on " + p + " is not allowed")

    hook.__defaults__[-1].append(hook)  # `me`: the hook refuses changes to itself
    sys.addaudithook(hook)
