"""What a sandbox promises: its layers, what a missing one means, its resource limits.

Each run reports the layers in force (`sandbox.SandboxResult.layers`, and the
``hello`` of worker/tester): ``process`` (a separate ``python -I -S -B``),
``env`` (clean environment), ``fsview`` (only interpreter and system files
visible, read-only), ``ramview`` (those files are a copy in RAM, `view`:
no page cache, inode or dentry cache of a disk that sandboxes share), ``fsro``
(legacy: everything read-only), ``netns``, ``pidns``, ``procns`` (a private
/proc without the cross-uid views such as /proc/key-users and the host's
cumulative counters such as /proc/stat), ``uid`` (a real non-zero uid), ``nocaps``
(no capabilities, no_new_privs), ``rlimits`` (CPU, address space, file size,
processes, open files, queued signals, message queues, no core), ``nproc`` (PID
namespace + RLIMIT_NPROC of a uid of its own: a fork bomb is bounded whatever
the uid), ``timeout`` (wall clock kill), ``seccomp`` (a syscall filter: no
kernel keyrings, file locks, inotify/fanotify, memfd or SysV IPC, io_uring,
bpf, perf events, userfaultfd, no new user namespace, nothing that reads or
steers the page cache, no socket or pipe buffers past the default, no pidfds
or socket cookies, no socket but a unix one, no eventfds, no unique mount ids or
namespace ids), ``memcg`` (a memory cgroup of its own: ``memory.max`` with
swap off on cgroup v2, ``memory.limit_in_bytes`` + ``memsw`` on v1; kernel
memory such as tmpfs inodes is charged to it), ``tmpcap`` (its writable /tmp
limited in inodes as well as bytes, with or without a memory cgroup),
``audit`` (legacy tripwire, never required). When one of `REQUIRED_LAYERS` is
missing, a warning naming it is logged once per process; with
``MENTOR_SANDBOX_STRICT=1`` the run refuses instead (`SandboxUnavailable`).
Whatever the backend, code never runs as uid 0: the harness checks its own
identity before any untrusted code runs and exits if it is root.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUIRED_LAYERS = ("process", "env", "fsview", "ramview", "netns", "pidns", "procns", "uid", "nocaps", "rlimits", "nproc",
                   "timeout", "seccomp", "memcg", "tmpcap")
# What a missing layer means, as the warning says it.
LAYER_MEANING = {
    "process": "the code does not run in a separate isolated interpreter",
    "env": "the code sees the caller's environment variables",
    "fsview": "the code can read every world-readable file, datasets and their tests included",
    "ramview": "the files the code reads are the host's, on disk: whether their pages, inodes and names are cached is "
               "state shared by every sandbox and kept across runs, readable by timing (a cold page took 43-5,500 us "
               "here, a cached one under 5)",
    "netns": "the code can reach the network",
    "pidns": "the code can see other processes and leave processes behind",
    "procns": "the code can see other processes, other uids' key quotas, or host-wide counters it can also move "
              "(the fork count of /proc/stat), in /proc",
    "uid": "the code does not run as an unprivileged uid of its own",
    "nocaps": "the code keeps capabilities",
    "rlimits": "its CPU, memory, file-size and process limits are not all set",
    "nproc": "it has no process limit of its own: a fork bomb is bounded only by the wall-clock kill",
    "timeout": "it has no wall-clock limit",
    "seccomp": "the code can use kernel keyrings, file locks, inotify, memfd/SysV shared memory, new user namespaces, "
               "fadvise/mincore/RWF_NOWAIT, large socket buffers, pidfds, netlink and TCP sockets, eventfds and "
               "unique mount ids: state that outlives the run, signals between concurrent sandboxes, memory outside "
               "its limits",
    "memcg": "no memory cgroup bounds the sandbox as a whole: memory outside the address-space limit (page cache, pipes, "
             "kernel objects) is bounded only by the per-process limits, the syscall filter and the /tmp caps",
    "tmpcap": "its writable /tmp has no inode limit: empty files pin kernel memory (400,000 of them 366 MiB here), "
              "bounded only by the memory cgroup, if any",
}


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
    max_relay: int = 64 << 20  # bytes of calls and replies one check may relay through the caller
    namespaces: bool = True  # legacy backend: try namespaces
    audit: bool = True  # legacy backend: the audit-hook tripwire

    @property
    def group_bytes(self) -> int:
        return int(self.cgroup_bytes) if self.cgroup_bytes else int(self.memory_bytes + self.tmp_bytes + (64 << 20))



def identity_ok(ident: dict) -> bool:
    """Whether the identity a harness reported is an unprivileged one (never uid 0, real or effective)."""
    return isinstance(ident, dict) and ident.get("uid") not in (0, None) and ident.get("euid") not in (0, None)
