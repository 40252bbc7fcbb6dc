"""A memory cgroup per running sandbox (cgroup v2, or the v1 memory controller): `MemCgroups`."""

from __future__ import annotations

import os
import re
import threading
import time


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
