"""The syscall filter every sandbox runs under (classic BPF, as ``bwrap --seccomp`` and the legacy layers load it)."""

from __future__ import annotations

import platform
import struct
import sys
from functools import lru_cache


# The syscalls a sandbox never needs and that hold state beyond the run, open a channel to another
# sandbox, or hold memory outside RLIMIT_AS: kernel keyrings (the slot uid's user keyring outlives
# the run), flock/fcntl locks and inotify/fanotify watches (on the read-only files every sandbox
# shares), memfd and SysV shared memory (pages outside the address space), io_uring, bpf,
# perf_event_open and userfaultfd (attack surface); plus new user namespaces (a tmpfs of its own,
# keyrings of its own) and clone3, whose flags sit in memory a filter cannot read (ENOSYS: glibc
# falls back to clone, whose flags it checks).
# Issue 48: what reads or steers the page cache of the files every sandbox shares (state that
# outlives the run): fadvise, readahead, mincore, cachestat, process_madvise, Linux AIO (io_submit
# takes RWF_NOWAIT too, and io_setup draws on a host-wide pool), preadv2/pwritev2 with RWF_NOWAIT,
# and madvise MADV_WILLNEED/COLD/PAGEOUT/COLLAPSE; and what pins kernel memory no cgroup v1 charge
# bounds: socket buffers raised with SO_SNDBUF/SO_RCVBUF (to wmem_max, 4 MiB a socket here) and pipes
# grown with F_SETPIPE_SZ; and host-wide counters a run can both advance and read, so that a later
# run reads what it left: pidfd_open and clone(CLONE_PIDFD) (a pidfd's inode number counts every
# process the host ever started) and the socket cookies of getsockopt(SO_COOKIE, SO_NETNS_COOKIE).
# Issue 58: the other ways to the host's ids and counters. Sockets of any family but AF_UNIX
# (EAFNOSUPPORT: the sandbox has no network, so they serve nothing): netlink's sock_diag hands out
# socket cookies (a host-wide counter that moves only when someone asks for a cookie: 1, 2, 3... here),
# netlink's port ids fall back to a host-wide rover on a collision, and every TCP socket moves the
# host-wide count in /proc/self/net/sockstat; eventfds (their "eventfd-id" in /proc/self/fdinfo is the
# lowest id free on the whole host, so it counts the eventfds a concurrent sandbox holds); statx,
# statmount, listmount and name_to_handle_at (ENOSYS / EPERM: the 64-bit unique mount id is a host-wide
# count of every mount ever made, about 80 more per sandbox started); and the namespace ioctls of
# nsfs (type 0xb7: NS_GET_MNTNS_ID and the other namespace ids, host-wide counters too). And sysinfo
# (ENOSYS), the host's memory and process counts and load average in one call: a sample that writes
# and frees 12 MiB of its /tmp moves ``sharedram`` by exactly that much, and a sample scored beside it
# reads the rhythm (4 of 4 here); the load average carries what a run spun to the next one. And syslog
# (EPERM): the kernel's log is host-wide, a run writes to it by crashing (the kernel logs a segfault, an
# OOM kill) and where kernel.dmesg_restrict is 0 any uid reads it back (1 here and on current Debian
# and Ubuntu, where it failed already).
_SYSCALLS = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "flock": 73, "inotify_init": 253, "inotify_add_watch": 254,
        "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301, "memfd_create": 319, "memfd_secret": 447,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 323, "perf_event_open": 298, "bpf": 321,
        "fadvise64": 221, "readahead": 187, "mincore": 27, "cachestat": 451, "process_madvise": 440,
        "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210, "io_pgetevents": 333,
        "fcntl": 72, "unshare": 272, "clone": 56, "clone3": 435, "preadv2": 327, "pwritev2": 328, "madvise": 28,
        "setsockopt": 54, "getsockopt": 55, "pidfd_open": 434,
        "socket": 41, "socketpair": 53, "eventfd": 284, "eventfd2": 290, "statx": 332, "statmount": 457, "listmount": 458,
        "name_to_handle_at": 303, "ioctl": 16, "sysinfo": 99, "syslog": 103}),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "flock": 32, "inotify_init1": 26, "inotify_add_watch": 27,
        "fanotify_init": 262, "fanotify_mark": 263, "memfd_create": 279, "memfd_secret": 447,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "perf_event_open": 241, "bpf": 280,
        "fadvise64": 223, "readahead": 213, "mincore": 232, "cachestat": 451, "process_madvise": 440,
        "io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292,
        "fcntl": 25, "unshare": 97, "clone": 220, "clone3": 435, "preadv2": 286, "pwritev2": 287, "madvise": 233,
        "setsockopt": 208, "getsockopt": 209, "pidfd_open": 434,
        "socket": 198, "socketpair": 199, "eventfd2": 19, "statx": 291, "statmount": 457, "listmount": 458,
        "name_to_handle_at": 264, "ioctl": 29, "sysinfo": 179, "syslog": 116}),
}
_SPECIAL = ("fcntl", "unshare", "clone", "clone3", "preadv2", "pwritev2", "madvise", "setsockopt", "getsockopt",
            "socket", "socketpair", "statx", "statmount", "listmount", "ioctl", "sysinfo")
# Answered ENOSYS, as by a kernel without them: what calls them falls back (glibc, coreutils: fstatat).
# sysinfo's one caller in glibc, get_phys_pages (qsort_r asks it once per process whether a large sort
# may malloc; CPython's posix module sorts its tables at startup), ignores the failure: qsort still
# sorts (in place or with malloc), and only sysconf(_SC_PHYS_PAGES/_SC_AVPHYS_PAGES) says nothing true.
_ENOSYS = ("clone3", "statx", "statmount", "listmount", "sysinfo")
# fcntl commands that take, test or watch a lock or lease: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK,
# F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY; and F_SETPIPE_SZ.
_LOCK_CMDS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026, 1031)
_CLONE_NEWUSER, _CLONE_PIDFD = 0x10000000, 0x1000
_RWF_NOWAIT = 0x8
# madvise advice that reads ahead, evicts or reshapes page-cache pages: WILLNEED, COLD, PAGEOUT, COLLAPSE.
_MADV = (3, 20, 21, 25)
# setsockopt(SOL_SOCKET, ...): SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE; getsockopt(SOL_SOCKET,
# ...): SO_COOKIE, SO_NETNS_COOKIE (the same numbers on both CPUs).
_SOL_SOCKET, _SOCKBUF, _COOKIES = 1, (7, 8, 32, 33), (57, 71)
_AF_UNIX, _EAFNOSUPPORT = 1, 97
_NSIO = 0xB700  # the nsfs ioctls: _IO(0xb7, n)


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
    for name in _ENOSYS:
        op(jeq, nr[name], "enosys")
    op(jeq, nr["socket"], "socket")
    op(jeq, nr["socketpair"], "socket")
    op(jeq, nr["ioctl"], "ioctl")
    op(jeq, nr["fcntl"], "fcntl")
    op(jeq, nr["unshare"], "userns")
    op(jeq, nr["clone"], "userns")
    op(jeq, nr["preadv2"], "rwf")
    op(jeq, nr["pwritev2"], "rwf")
    op(jeq, nr["madvise"], "madvise")
    op(jeq, nr["setsockopt"], "setsockopt")
    op(jeq, nr["getsockopt"], "getsockopt")
    op(ret, allow)
    labels = {"fcntl": len(prog)}
    op(ld, 24)  # low word of args[1]: the command
    for cmd in _LOCK_CMDS:
        op(jeq, cmd, "eperm")
    op(ret, allow)
    labels["rwf"] = len(prog)
    op(ld, 56)  # low word of args[5]: the RWF_* flags
    op(jset, _RWF_NOWAIT, "eperm")
    op(ret, allow)
    labels["madvise"] = len(prog)
    op(ld, 32)  # low word of args[2]: the advice
    for advice in _MADV:
        op(jeq, advice, "eperm")
    op(ret, allow)
    for label, names in (("setsockopt", _SOCKBUF), ("getsockopt", _COOKIES)):
        labels[label] = len(prog)
        op(ld, 24)  # low word of args[1]: the level
        prog.append([jeq, None, "allow", _SOL_SOCKET])
        op(ld, 32)  # low word of args[2]: the option
        for name in names:
            op(jeq, name, "eperm")
        op(ret, allow)
    labels["allow"] = len(prog) - 1
    labels["socket"] = len(prog)
    op(ld, 16)  # low word of args[0]: the address family
    prog.append([jeq, None, "eafnosupport", _AF_UNIX])
    op(ret, allow)
    labels["eafnosupport"] = len(prog)
    op(ret, errno | _EAFNOSUPPORT)
    labels["ioctl"] = len(prog)
    op(ld, 24)  # low word of args[1]: the request
    op(0x54, 0xFF00)  # BPF_ALU|BPF_AND|BPF_K: its type byte
    op(jeq, _NSIO, "eperm")
    op(ret, allow)
    labels["userns"] = len(prog)
    op(ld, 16)  # low word of args[0]: the flags of unshare and clone
    op(jset, _CLONE_NEWUSER | _CLONE_PIDFD, "eperm")
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
