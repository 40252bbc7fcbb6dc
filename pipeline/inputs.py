"""Input files: expand files, folders and globs into a sorted list (bounded, symlink-loop safe),
keep a command's own outputs out of its inputs, and check JSONL line by line."""

from __future__ import annotations

import fnmatch
import glob as globlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

from mentor.pipeline.errors import ConfigError, DataError

log = logging.getLogger(__name__)


# Every input walk is bounded: a folder tree or `**` pattern that reaches more entries or
# levels than these is an error (a runaway walk is a mistake, never a data set).
MAX_WALK_ENTRIES = 2_000_000
MAX_WALK_DEPTH = 64


def resolve_inputs(sources: Iterable[str | os.PathLike], suffixes: tuple[str, ...] = (".parquet",)) -> list[Path]:
    """Expand files, directories (recursively, by suffix) and globs into a sorted file list.

    Folders and ``**`` patterns are walked with `walk_files`: symlinked folders
    are followed but never twice (a symlink loop ends), and the walk is bounded.
    Raises `ConfigError` for a source that matches nothing.
    """
    out: list[Path] = []
    for src in sources:
        s = str(src)
        p = Path(s)
        if any(ch in s for ch in "*?["):
            matches = sorted(glob_files(s))
            if not matches:
                raise ConfigError(f"{s}: the pattern matches no file; check the path")
            out.extend(matches)
        elif p.is_dir():
            matches = sorted(f for f in walk_files(p, s) if f.name.endswith(suffixes) and not _hidden(f, p))
            if not matches:
                raise ConfigError(f"{s}: the directory holds no {'/'.join(suffixes)} file")
            out.extend(matches)
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise ConfigError(f"{s}: not a regular file or folder (a device, pipe or socket); pass a file or folder")
        else:
            raise ConfigError(f"{s}: no such file or directory")
    # Keep order, drop repeats.
    seen: set[Path] = set()
    unique = []
    for f in out:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def outside_output(paths: list[Path], sources: Iterable[str | os.PathLike], out_dir: str | os.PathLike) -> list[Path]:
    """`paths` without the files a folder or pattern walk found inside the command's own output
    folder (its earlier outputs are not inputs); files named inside it explicitly stay."""
    out = Path(os.path.abspath(out_dir))

    def inside(p: Path) -> bool:
        q = Path(os.path.abspath(p))
        return q == out or out in q.parents

    if any(inside(Path(str(s).split("*")[0] or ".")) for s in sources):
        return paths
    kept = [p for p in paths if not inside(p)]
    if len(kept) != len(paths):
        log.warning("%d input file(s) inside the output folder %s are not read (earlier outputs)", len(paths) - len(kept), out_dir)
    if not kept:
        raise ConfigError(f"{out_dir}: every input file lies in the output folder; pass the logs, not the output")
    return kept


def walk_files(root: Path, where: str | None = None) -> Iterator[Path]:
    """Every file below `root` (paths spelled under `root`), following symlinked folders but
    entering each real folder once, so a symlink loop cannot make the walk endless.

    `ConfigError` (naming `where`) past `MAX_WALK_ENTRIES` entries or `MAX_WALK_DEPTH`
    levels; `DataError` for a folder that cannot be read.
    """
    where = where or str(root)
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Path, int]] = [(root, 0)]
    entries = 0
    while stack:
        folder, depth = stack.pop()
        try:
            st = folder.stat()
        except OSError:
            continue  # a dangling or looping symlink: nothing to read
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if depth > MAX_WALK_DEPTH:
            raise ConfigError(f"{where}: folders nested deeper than {MAX_WALK_DEPTH} levels; pass a narrower path or pattern")
        try:
            with os.scandir(folder) as it:
                listing = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"{folder}: cannot list the folder ({exc.strerror}); fix its permissions or pass the files themselves") from exc
        entries += len(listing)
        if entries > MAX_WALK_ENTRIES:
            raise ConfigError(f"{where}: more than {MAX_WALK_ENTRIES:,} entries below it; pass a narrower path or pattern")
        subdirs = []
        for entry in listing:
            path = folder / entry.name
            try:
                if entry.is_dir():
                    subdirs.append((path, depth + 1))
                elif entry.is_file():
                    yield path
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def glob_files(pattern: str) -> list[Path]:
    """The files a glob pattern matches, like ``glob.glob(pattern, recursive=True)`` (hidden
    names only where the pattern spells the dot) but with ``**`` walked by `walk_files`:
    bounded, and ending on symlink loops."""
    if "**" not in pattern:
        return [Path(m) for m in globlib.glob(pattern) if os.path.isfile(m)]
    parts = Path(pattern).parts
    fixed = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    pats = parts[fixed:]
    if not root.is_dir():
        return []
    out = []
    for f in walk_files(root, pattern):
        rel = f.relative_to(root).parts
        if _match_parts(rel, pats):
            out.append(f if fixed else Path(*rel))
    return out


def _match_parts(parts: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    """Whether path components `parts` match glob components `pats` (``**``: any number of folders)."""
    @lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if j == len(pats):
            return i == len(parts)
        pat = pats[j]
        if pat == "**":
            if match(i, j + 1):
                return True
            return i < len(parts) and not parts[i].startswith(".") and match(i + 1, j)
        if i == len(parts) or (parts[i].startswith(".") and not pat.startswith(".")):
            return False
        return fnmatch.fnmatchcase(parts[i], pat) and match(i + 1, j + 1)

    return match(0, 0)


def _hidden(f: Path, root: Path) -> bool:
    """Temporary files, done markers and hidden folders are never inputs."""
    rel = f.relative_to(root).parts
    return any(part.startswith((".", "_")) for part in rel)


def jsonl_problem(path: Path) -> str | None:
    """The first line of a JSONL file that is not a JSON object, as ``path:line: what``; None if all are."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); re-encode the file as UTF-8"
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                return f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
            except RecursionError:
                return f"{path}:{lineno}: JSON nested too deeply to read"
            if not isinstance(rec, dict):
                return f"{path}:{lineno}: a JSON {type(rec).__name__}, not an object (JSONL holds one object per line)"
    return None


__all__ = ["glob_files", "jsonl_problem", "outside_output", "resolve_inputs", "walk_files"]
