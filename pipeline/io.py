"""Parquet/JSON I/O: input resolution, validated scans, atomic writes, manifests, strict YAML.

Naming follows polars: ``scan_*`` is lazy, ``read_*`` is eager, ``write_*``
writes. Every write goes to a temporary name in the destination folder and is
renamed into place, so a killed process never leaves a partial output file.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError, CorruptFileError, DataError, SchemaError
from mentor.pipeline.schemas import SCHEMA_VERSION, SCHEMAS, conform, require_schema, schema_metadata

PARQUET_COMPRESSION = "zstd"
# Row groups of this many rows: readers (polars, pyarrow, dask) decode row groups in
# parallel and prune them on statistics, which one file-sized row group defeats.
ROW_GROUP_ROWS = 128 * 1024
log = logging.getLogger(__name__)
_UMASK = os.umask(0)
os.umask(_UMASK)


# --------------------------------------------------------------------------- inputs


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
    import fnmatch

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


def read_parquet_schema(path: Path) -> pa.Schema:
    """The file's Arrow schema; `DataError` naming the file if it is empty or corrupt."""
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); re-create it or remove it from the inputs")
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc}); re-create it or remove it from the inputs") from exc


def check_dataset_files(paths: list[Path], dataset: str, fix: str | None = None) -> pa.Schema:
    """Validate every file against `dataset` and that the shards agree with one another.

    Returns the schema of the first file.
    """
    if not paths:
        raise ConfigError(f"no input files for the '{dataset}' dataset")
    first: pa.Schema | None = None
    for path in paths:
        schema = read_parquet_schema(path)
        require_schema(schema, dataset, str(path), fix)
        if first is None:
            first = schema
            first_path = path
        else:
            a = {f.name: f.type for f in first}
            b = {f.name: f.type for f in schema}
            if set(a) != set(b) or any(str(a[k]) != str(b[k]) for k in a):
                diff = sorted(set(a) ^ set(b)) or sorted(k for k in a if str(a[k]) != str(b[k]))
                raise SchemaError(
                    f"{path}: shards have mixed schemas (differs from {first_path} in columns {diff}); "
                    "re-ingest all shards with the same mentor version"
                )
    assert first is not None
    return first


def scan_dataset(sources: Iterable[str | os.PathLike], dataset: str, fix: str | None = None) -> pl.LazyFrame:
    """Lazily scan canonical Parquet shards of `dataset`, validated and cast to the schema."""
    paths = resolve_inputs(sources)
    found = check_dataset_files(paths, dataset, fix)
    lf = pl.scan_parquet([str(p) for p in paths])
    return cast_lazy(lf, found, dataset)


def cast_lazy(lf: pl.LazyFrame, found: pa.Schema, dataset: str) -> pl.LazyFrame:
    """Cast columns to the canonical types, adding absent optional columns as nulls."""
    expected = SCHEMAS[dataset]
    target = pl.from_arrow(expected.empty_table()).schema
    exprs = []
    for field in expected:
        dtype = target[field.name]
        if field.name in found.names:
            exprs.append(pl.col(field.name).cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(field.name))
    return lf.select(exprs)


def read_dataset(sources: Iterable[str | os.PathLike], dataset: str) -> pl.DataFrame:
    return scan_dataset(sources, dataset).collect()


def read_table(sources: Iterable[str | os.PathLike], dataset: str) -> pa.Table:
    """Eager read as an Arrow table conformed to the canonical schema.

    The values are checked too (`check_values`): a file from another writer can have
    the right columns and still hold nulls where the schema requires a value.
    """
    paths = resolve_inputs(sources)
    check_dataset_files(paths, dataset)
    tables = []
    for p in paths:
        table = conform(pq.read_table(p), dataset)
        check_values(table, dataset, str(p))
        tables.append(table)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if dataset == "collapsed" and len(tables) > 1:
        check_values(table, dataset, f"{paths[0]} (and {len(paths) - 1} more)")
    return table


def check_values(table: pa.Table, dataset: str, where: str) -> None:
    """`DataError` naming `where`, the column and a few rows where a required column is null;
    for collapsed sets also a repeated problem_id or an unknown domain (one row per problem)."""
    from mentor.pipeline.schemas import DOMAINS

    schema = SCHEMAS[dataset]
    for field in schema:
        col = table.column(field.name)
        if not field.nullable and col.null_count:
            rows = [i for i, v in enumerate(col.to_pylist()) if v is None][:5]
            raise DataError(
                f"{where}: column {field.name!r} is null in {col.null_count} row(s) (rows {rows}); every row needs it: "
                f"re-create the file with mentor (dataset '{dataset}')"
            )
    if dataset == "collapsed" and table.num_rows:
        ids = pl.from_arrow(table.select(["problem_id", "domain"]))
        dup = ids.filter(pl.col("problem_id").is_duplicated()).get_column("problem_id").unique().head(5).to_list()
        if dup:
            raise DataError(f"{where}: problem_id {dup} appear(s) more than once; a collapsed set has one row per problem")
        bad = ids.filter(~pl.col("domain").is_in(list(DOMAINS))).get_column("domain").unique().head(5).to_list()
        if bad:
            raise DataError(f"{where}: domain {bad} is not one of {', '.join(DOMAINS)}")
        blank = ids.filter(pl.col("problem_id").str.strip_chars() == "").height
        if blank:
            raise DataError(f"{where}: {blank} row(s) with an empty problem_id")


# --------------------------------------------------------------------------- atomic writes


def temp_path_beside(path: str | os.PathLike) -> Path:
    """A new empty temporary file in `path`'s folder (hidden, ``.tmp``: never read as an input)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual mode
    return tmp_path


def commit_file(tmp: Path, path: str | os.PathLike) -> None:
    """fsync `tmp`, then rename it onto `path`: readers see the old file or the whole new one."""
    try:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only on success."""
    tmp_path = temp_path_beside(path)
    try:
        yield tmp_path
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    commit_file(tmp_path, path)


def to_table(data: pa.Table | pl.DataFrame, dataset: str | None) -> pa.Table:
    table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
    if dataset is not None:
        table = conform(table, dataset)
    return table


def write_parquet_atomic(
    data: pa.Table | pl.DataFrame,
    path: str | os.PathLike,
    dataset: str | None = None,
    row_group_size: int | None = None,
) -> Path:
    """Write `data` (conformed to the `dataset` schema if given) to `path` atomically.

    Output is deterministic: same table → same bytes (no timestamps are written).
    """
    table = to_table(data, dataset)
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(
            table,
            tmp,
            compression=PARQUET_COMPRESSION,
            row_group_size=row_group_size or ROW_GROUP_ROWS,
            write_statistics=True,
        )
    return path


@contextmanager
def parquet_writer_atomic(path: str | os.PathLike, dataset: str) -> Iterator[Callable[[pa.Table | pl.DataFrame], None]]:
    """Stream row groups into `path` (schema: `dataset`); the file appears, renamed, only when all are written.

    Yields ``write(table)``; each call appends the table (conformed) as row groups.
    A run with no ``write`` calls still leaves a valid empty file with the schema.
    """
    schema = pa.schema(list(SCHEMAS[dataset]), metadata=schema_metadata(dataset))
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression=PARQUET_COMPRESSION, write_statistics=True) as w:
        yield lambda data: w.write_table(to_table(data, dataset))


def write_json_atomic(obj: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file; `CorruptFileError` naming it (and the fix) when it does not parse."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise CorruptFileError(
            f"{path}: not valid JSON{where}; it was edited or cut short: restore it, or delete it and re-run the stage that wrote it"
        ) from exc


# A settings file is small: more values than this (counted with every alias expanded, long
# strings by their length) or deeper nesting is an error, so an alias bomb ("billion
# laughs") fails at once instead of expanding into gigabytes when the settings are
# validated, hashed or saved.
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 100


def _strict_yaml_loader():
    """A yaml.SafeLoader that rejects duplicate keys, alias bombs and runaway nesting."""
    import yaml
    from yaml.constructor import ConstructorError
    from yaml.error import MarkedYAMLError
    from yaml.events import AliasEvent
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    class StrictLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self._sizes: dict[int, int] = {}
            self._depth = 0

        def compose_node(self, parent, index):
            self._depth += 1
            try:
                if self._depth > YAML_MAX_DEPTH:
                    raise MarkedYAMLError(None, None, f"nested deeper than {YAML_MAX_DEPTH} levels", self.peek_event().start_mark)
                if self.check_event(AliasEvent):
                    anchor = self.peek_event().anchor
                    target = self.anchors.get(anchor)
                    if target is not None and id(target) not in self._sizes:
                        raise MarkedYAMLError(None, None, f"the alias *{anchor} refers to a value that contains it (recursive alias)",
                                              self.peek_event().start_mark)
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            key = id(node)
            if key not in self._sizes:
                if isinstance(node, ScalarNode):
                    size = 1 + len(node.value) // 64  # long strings weigh more: an alias copies them whole
                elif isinstance(node, SequenceNode):
                    size = 1 + sum(self._size(c) for c in node.value)
                elif isinstance(node, MappingNode):
                    size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
                else:  # pragma: no cover
                    size = 1
                self._sizes[key] = size
                if size > YAML_MAX_NODES:
                    raise MarkedYAMLError(
                        None, None, f"expands to more than {YAML_MAX_NODES:,} values through aliases (*name); "
                        "write the values out instead of nesting aliases", node.start_mark,
                    )
            return node

        def _size(self, node) -> int:
            return self._sizes[id(node)]

        def construct_mapping(self, node, deep=False):
            if isinstance(node, MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeConstructor rejects it itself
                        continue
                    if first is not None:
                        raise ConstructorError(None, None, f"duplicate key {key!r} (first at line {first}); keep one", key_node.start_mark)
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml_text(text: str):
    """Parse YAML settings with `_strict_yaml_loader`; raises yaml.YAMLError."""
    loader = _strict_yaml_loader()(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | os.PathLike, what: str = "settings") -> dict[str, Any]:
    """A YAML file that must hold a mapping; `ConfigError` naming the file otherwise.

    Duplicate keys, alias bombs, runaway nesting and undecodable bytes are errors too.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from exc
    try:
        data = load_yaml_text(text) or {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        detail = exc.problem or str(exc)
        if exc.context and "duplicate key" not in detail:
            detail = f"{exc.context}, {detail}"
        raise ConfigError(f"{path}: {where}not valid YAML: {detail}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of {what}, found {type(data).__name__}")
    return data


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-able config (pydantic models allowed)."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_manifest(
    out_dir: str | os.PathLike,
    shards: list[Path],
    dataset: str,
    inputs: list[Path] | None = None,
    config: Any = None,
    extra: dict[str, Any] | None = None,
    hashes: dict[str, str] | None = None,
) -> Path:
    """`manifest.json`: rows and sha256 per shard, schema version, inputs and their hashes, config.

    `hashes` (str(path) -> sha256) lets a writer that already hashed its files
    (e.g. in its writer threads) skip reading them again.
    """
    out_dir = Path(out_dir)
    known = hashes or {}

    def digest(p: Path) -> str:
        return known.get(str(p)) or sha256_file(p)

    manifest = {
        "dataset": dataset,
        "schema_version": SCHEMA_VERSION,
        "shards": [
            {"path": s.name, "rows": pq.ParquetFile(s).metadata.num_rows, "bytes": s.stat().st_size, "sha256": digest(s)}
            for s in shards
        ],
        "inputs": [{"path": str(p), "sha256": digest(p)} for p in (inputs or [])],
        "config": config.model_dump(mode="json") if hasattr(config, "model_dump") else config,
    }
    manifest["rows"] = sum(s["rows"] for s in manifest["shards"])
    if extra:
        manifest.update(extra)
    return write_json_atomic(manifest, out_dir / "manifest.json")


__all__ = [
    "atomic_path",
    "check_dataset_files",
    "commit_file",
    "config_hash",
    "read_dataset",
    "read_json",
    "read_parquet_schema",
    "read_table",
    "read_yaml_mapping",
    "resolve_inputs",
    "scan_dataset",
    "schema_metadata",
    "sha256_file",
    "temp_path_beside",
    "write_json_atomic",
    "write_manifest",
    "write_parquet_atomic",
]
