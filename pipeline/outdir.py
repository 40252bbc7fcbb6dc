"""Output folders written all or nothing, and disk errors as one-line messages.

A command that writes a folder of outputs (ingest, mine, build) writes them into a
fresh hidden folder beside the target, ``.<name>.<command>-<pid>-<random>.tmp``, and
swaps it in at the end with one atomic rename (RENAME_EXCHANGE where the kernel has
it). A reader, or a process killed at any point, sees the old folder or the new one,
never a mix. Entries of the target the command does not own (a workflow's ``_done``
markers, a user's notes) are carried into the new folder. A later run of the command
removes what a killed run left beside the target (and puts back what it had carried).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mentor.pipeline.errors import ConfigError, DataError, MentorError
from mentor.pipeline.faults import fault_point

log = logging.getLogger(__name__)
_UMASK = os.umask(0)
os.umask(_UMASK)

_STAGE_RE = re.compile(r"^\.(?P<name>.+)\.(?P<cmd>[a-z]+)-(?P<pid>\d+)-[a-z0-9_]+(?P<old>\.old)?\.tmp$")
_RENAME_EXCHANGE = 2


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def _pid_alive(pid: int) -> bool:
    return pid != os.getpid() and pid_alive(pid)  # this process's own: an earlier, finished call


def clean_stale_outputs(out_dir: Path, owned: Callable[[str], bool]) -> int:
    """Remove what killed runs left beside `out_dir`; returns how many were removed.

    An ``.old`` folder is a previous output moved aside by the two-rename swap: when
    `out_dir` is missing it is put back. Entries a staged folder carried over from the
    target (not `owned`) are moved back into `out_dir` first, so nothing of the user's is lost.
    """
    parent = out_dir.parent
    if not parent.is_dir():
        return 0
    removed = 0
    for entry in sorted(os.scandir(parent), key=lambda e: e.name):
        m = _STAGE_RE.match(entry.name)
        if not m or m.group("name") != out_dir.name or _pid_alive(int(m.group("pid"))):
            continue
        path = parent / entry.name
        if not entry.is_dir(follow_symlinks=False):
            path.unlink(missing_ok=True)
            removed += 1
            continue
        if m.group("old") and not out_dir.exists():
            os.rename(path, out_dir)  # the swap was cut between its two renames: the old output comes back
            continue
        if out_dir.is_dir():
            for child in os.scandir(path):
                if not owned(child.name) and not (out_dir / child.name).exists():
                    os.rename(path / child.name, out_dir / child.name)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d temporary folder(s) of killed runs beside %s", removed, out_dir)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two folders (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_output_dir(out_dir: Path, option: str = "--out") -> Path:
    """The real folder a command will replace, after the checks that must come before any work.

    A symlinked target is resolved (the new folder goes beside the real one, on its disk);
    the working folder (or one above it) cannot be replaced as a whole; an existing target
    must be a writable folder.
    """
    out_dir = Path(out_dir)
    real = out_dir.resolve() if out_dir.is_symlink() else Path(os.path.abspath(out_dir))
    if real.exists() and not real.is_dir():
        raise ConfigError(f"{option} {out_dir}: exists and is not a folder; pass a folder path")
    cwd = Path.cwd().resolve()
    if real.exists() and (real.resolve() == cwd or real.resolve() in cwd.parents):
        raise ConfigError(
            f"{option} {out_dir}: is the working folder (or holds it), which the command replaces as a whole; "
            f"pass a dedicated folder, e.g. {option} out"
        )
    if real.exists() and not os.access(real, os.W_OK | os.X_OK):
        if os.statvfs(real).f_flag & os.ST_RDONLY:
            raise DataError(f"{out_dir}: the output folder is on a read-only file system (EROFS); write to a writable disk "
                            f"or pass another {option}")
        raise DataError(f"{out_dir}: the output folder is not writable; make it writable (chmod u+w) or pass another {option}")
    return real


def check_output_file(path: str | os.PathLike, option: str = "--out") -> Path:
    """A file a command will write (its folders made as needed): refused before any work when it is a folder or when
    a path above it is a file (the write would fail at the end with "File exists" or "Not a directory")."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; pass a file path, e.g. {option} {path / 'report.json'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {path}: {parent} is a file, not a folder; pass a path in a folder "
                                  f"(e.g. {option} {parent.parent / path.name})")
            break
    return path


@dataclass(frozen=True)
class Owns:
    """What a stage (re)writes in its output folder, as `staged_output_dir` asks: these `files`,
    every ``part-*.parquet`` when `shards` (a reader takes any), and temporary files of earlier
    runs; anything else in the folder is carried into the new one."""

    files: tuple[str, ...]
    shards: bool = False

    def __call__(self, name: str) -> bool:
        return (name in self.files or (self.shards and name.startswith("part-") and name.endswith(".parquet"))
                or (name.startswith(".") and name.endswith(".tmp")))


@contextmanager
def staged_output_dir(out_dir: str | os.PathLike, command: str, owned: Callable[[str], bool],
                      option: str = "--out") -> Iterator[Path]:
    """Yield a fresh folder to write `command`'s outputs into; swap it in for `out_dir` on success.

    `owned(name)` tells the target's entries the command (re)writes from those it carries
    over. On any error the staged folder is removed and `out_dir` is left as it was; disk
    errors (out of space, read-only, no permission) become a `DataError` naming the folder.
    """
    target = check_output_dir(Path(out_dir), option)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_outputs(target, owned)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{command}-{os.getpid()}-", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise disk_error(exc, target, f"cannot create the temporary folder beside it in {target.parent}") from exc
    try:
        mode = target.stat().st_mode & 0o7777 if target.is_dir() else 0o777 & ~_UMASK
        os.chmod(staging, mode)
        yield staging
        _fsync_dir(staging)
        fault_point(f"{command}.before_swap")
        if not target.exists():
            os.rename(staging, target)
        else:
            for child in sorted(os.listdir(target)):
                if not owned(child) and not (staging / child).exists():
                    os.rename(target / child, staging / child)
            fault_point(f"{command}.carried")
            if not _exchange(staging, target):
                aside = staging.with_name(staging.name[: -len(".tmp")] + ".old.tmp")
                os.rename(target, aside)
                fault_point(f"{command}.moved_aside")
                os.rename(staging, target)
                staging = aside
            fault_point(f"{command}.swapped")
            shutil.rmtree(staging, ignore_errors=True)
        _fsync_dir(target.parent)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_error(exc):
            raise disk_error(exc, target) from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


_DISK_FIXES = {
    errno.ENOSPC: "free disk space or write to another disk",
    errno.EDQUOT: "free space within your quota or write elsewhere",
    errno.EROFS: "the file system is mounted read-only; write to a writable disk",
    errno.EACCES: "fix the permissions (chmod/chown) or write elsewhere",
    errno.EPERM: "fix the permissions (chmod/chown) or write elsewhere",
}


def _disk_errno(exc: OSError) -> int | None:
    if exc.errno is not None:
        return exc.errno
    text = str(exc)  # pyarrow reports some failures without an errno, only in its message
    for needle, code in (("No space left", errno.ENOSPC), ("Read-only file system", errno.EROFS),
                         ("Permission denied", errno.EACCES), ("Disk quota exceeded", errno.EDQUOT)):
        if needle in text:
            return code
    return None


def is_disk_error(exc: BaseException) -> bool:
    """Out of space, read-only or no permission: the kinds of write failure a user fixes, not a bug."""
    return isinstance(exc, OSError) and _disk_errno(exc) in _DISK_FIXES


def disk_error(exc: OSError, where: Path | str, what: str | None = None) -> MentorError:
    """A one-line error for a failed write (out of space, read-only, permissions) naming `where`.

    Other OS errors are wrapped the same way, with their own text.
    """
    code = _disk_errno(exc)
    text = str(exc).strip()
    reason = os.strerror(code) if code else (exc.strerror or (text.splitlines()[0] if text else type(exc).__name__))
    name = errno.errorcode.get(code, "") if code else ""
    file = f" (at {exc.filename})" if getattr(exc, "filename", None) and str(exc.filename) != str(where) else ""
    fix = _DISK_FIXES.get(code, "check the disk and the path")
    head = f"{what}: " if what else ""
    return DataError(f"{where}: {head}{reason}{f' ({name})' if name else ''}{file}; {fix}")
