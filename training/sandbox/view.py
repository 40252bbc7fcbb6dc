"""What a bwrap sandbox can read, as a copy in RAM: the ``ramview`` layer.

Every file a sandbox can read is read by every other sandbox too, and the kernel
caches it once for all of them. On a disk-backed filesystem that cache is state
no run owns: whether a page (or an inode, or a failed name lookup) is cached
outlives the run and is visible to the next one. The syscall filter refuses the
calls that read or steer it directly (fadvise, readahead, mincore, cachestat,
RWF_NOWAIT...), but timing alone reads it too: here a first read of a cold page
of /usr took 43-5,500 µs and a cached one under 5 µs, so one run can set bits by
reading chosen pages and a later run can read them back. So the sandboxes do not
read the disk at all: they see a copy, made once per machine, on a RAM
filesystem (tmpfs), where every page is always resident, every inode and name is
pinned and no failed lookup is remembered (tmpfs keeps no negative dentries).

The copy holds the interpreter, its standard library (without its test suites,
site-packages, ``config-*`` and optimised bytecode), the shared libraries these
and ``sh`` load (``ldd``), plus
``libgcc_s`` (glibc loads it when a thread exits), the dynamic loader's cache,
the C.UTF-8 locale and the time-zone data; ``/usr/bin/python3`` in it is the
sandbox's interpreter. 86 MiB with pyenv's Python 3.11 on Debian 12. Files keep their
paths, modes and modification times (so the bytecode caches stay valid).

Where: ``MENTOR_SANDBOX_VIEW=DIR`` (a directory on a RAM filesystem), else
``/dev/shm/mentor-sandbox-view-UID``. One subdirectory per content key (the
files' sizes and times, the loader cache's), built under a temporary name and
renamed into place, so processes on one machine share it and a killed build
leaves no half copy. A copy whose key no longer matches (the interpreter or the
libraries were upgraded) stays until removed by hand or a reboot.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from functools import lru_cache

FORMAT = 1
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
_TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_EXTRAS = ("/etc/ld.so.cache", "/usr/share/zoneinfo", "/usr/lib/locale/C.utf8", "/usr/lib/locale/C.UTF-8")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _on_ram(path: str) -> str | None:
    """The filesystem type of the mount holding `path` when it is tmpfs/ramfs, else None."""
    best, fstype = "", None
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                f = left.split()
                point = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), f[4]) if len(f) > 4 else ""
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, fstype = point, right.split()[0] if right.split() else None
    except OSError:
        return None
    return fstype if fstype in ("tmpfs", "ramfs") else None


def _stdlib_files(stdlib: tuple[str, ...], site: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    out = []
    todo = list(stdlib)
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in _SKIP_DIRS and not e.name.startswith("config-") and e.path not in site:
                        todo.append(e.path)
                elif ".opt-" not in e.name:
                    out.append((e.path, e.stat(follow_symlinks=False)))
    return out


def _tree(path: str) -> list[tuple[str, os.stat_result]]:
    if not os.path.isdir(path):
        return [(path, os.lstat(path))] if os.path.lexists(path) else []
    return [(os.path.join(dp, f), os.lstat(os.path.join(dp, f))) for dp, _, fs in os.walk(path) for f in fs]


def _sources(exe: str, stdlib: tuple[str, ...], site: tuple[str, ...], tools: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
    files = _stdlib_files(stdlib, site)
    for p in (exe, *tools, *_EXTRAS):
        files += _tree(p)
    return sorted(files)


def _key(files: list[tuple[str, os.stat_result]]) -> str:
    h = hashlib.sha256(f"mentor-sandbox-view {FORMAT}\n".encode())
    for p, st in files:
        h.update(f"{p}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _libraries(objects: list[str]) -> list[str]:
    """The shared libraries (and the loader) `objects` load, by ldd; plus libgcc_s beside libc."""
    out: dict[str, None] = {}
    for i in range(0, len(objects), 200):
        res = subprocess.run(["ldd", *objects[i:i + 200]], capture_output=True, text=True, timeout=120)
        for m in _LDD_PATH.finditer(res.stdout):
            out[m.group(1)] = None
    for lib in list(out):
        if os.path.basename(lib) == "libc.so.6":
            gcc = os.path.join(os.path.dirname(lib), "libgcc_s.so.1")
            if os.path.exists(gcc):
                out[gcc] = None
    if not any(os.path.basename(p).startswith("libc.") for p in out):
        raise OSError("ldd found no C library for the interpreter")
    return list(out)


def _add(view: str, path: str, hops: int = 0) -> None:
    """Copy `path` into `view` at the same path, recreating every symlink on the way (a file's
    mode and modification time kept, readable by all; directories 0755)."""
    if hops > 40:
        raise OSError(f"too many symlinks at {path}")
    parts = [p for p in path.split("/") if p]
    cur = ""
    for i, name in enumerate(parts):
        cur += "/" + name
        dest = view + cur
        st = os.lstat(cur)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(cur)
            if not os.path.lexists(dest):
                os.symlink(target, dest)
            rest = "/".join(parts[i + 1:])
            resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
            return _add(view, resolved + ("/" + rest if rest else ""), hops + 1)
        if stat.S_ISDIR(st.st_mode):
            if i == len(parts) - 1:
                for dp, _, fs in os.walk(cur):
                    for f in fs:
                        _add(view, os.path.join(dp, f), hops)
                return
            if not os.path.isdir(dest):
                os.mkdir(dest, 0o755)
                os.chmod(dest, 0o755)
        elif stat.S_ISREG(st.st_mode):
            if not os.path.exists(dest):
                shutil.copy2(cur, dest)
                os.chmod(dest, (st.st_mode & 0o755) | 0o444 | (0o111 if st.st_mode & 0o100 else 0))
            return


def _build(view: str, exe: str, files: list[str], tools: tuple[str, ...]) -> None:
    os.mkdir(view, 0o755)
    for top in _TOP_LINKS:
        if os.path.islink("/" + top):
            os.symlink(os.readlink("/" + top), os.path.join(view, top))
    for p in files:
        _add(view, p)
    elfs = [exe, *tools, *(p for p in files if ".so" in os.path.basename(p) and os.path.isfile(p))]
    for lib in _libraries(elfs):
        _add(view, lib)
    for name in ("python3", "python"):
        link = view + "/usr/bin/" + name
        if exe not in ("/usr/bin/" + name,) and os.path.isdir(view + "/usr/bin"):
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(exe, link)


def _private_dir(base: str) -> None:
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{base} is not a private directory of this user")


def _sweep(base: str) -> None:
    """Remove half-built copies whose builder has died."""
    for name in os.listdir(base):
        m = re.fullmatch(r"\.build-(\d+)-\w+", name)
        if m:
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            except PermissionError:
                pass


@lru_cache(maxsize=4)
def ensure(exe: str, stdlib: tuple[str, ...], site: tuple[str, ...], tools: tuple[str, ...]) -> tuple[str | None, str]:
    """(the view directory, "") once it exists, or (None, why it cannot be had here)."""
    base = os.environ.get("MENTOR_SANDBOX_VIEW") or f"/dev/shm/mentor-sandbox-view-{os.geteuid()}"
    parent = os.path.dirname(os.path.abspath(base))
    if not os.path.isdir(parent) or not _on_ram(parent):
        return None, f"{parent} is not a RAM filesystem (tmpfs); set MENTOR_SANDBOX_VIEW to a directory on one"
    try:
        _private_dir(base)
        _sweep(base)
        sources = _sources(exe, stdlib, site, tools)
        view = os.path.join(base, _key(sources))
        if os.path.isdir(view) and not os.path.islink(view):
            return view, ""
        tmp = os.path.join(base, f".build-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            _build(tmp, exe, [p for p, _ in sources], tools)
            try:
                os.rename(tmp, view)
            except OSError:
                if not os.path.isdir(view):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return view, ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"no copy of the sandbox's files in {base}: {exc}"[:400]


def bwrap_args(view: str) -> list[str]:
    """bwrap options that make the view's top-level entries the sandbox's (all read-only)."""
    args = []
    for name in sorted(os.listdir(view)):
        path = os.path.join(view, name)
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), "/" + name]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, "/" + name]
    return args


def size_bytes(view: str) -> int:
    return sum(os.lstat(os.path.join(dp, f)).st_size for dp, _, fs in os.walk(view) for f in fs)
