"""Parquet/JSON I/O: input resolution, validated scans, atomic writes, manifests.

Naming follows polars: ``scan_*`` is lazy, ``read_*`` is eager, ``write_*``
writes. Every write goes to a temporary name in the destination folder and is
renamed into place, so a killed process never leaves a partial output file.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError, DataError, SchemaError
from mentor.pipeline.schemas import SCHEMA_VERSION, SCHEMAS, conform, require_schema, schema_metadata

PARQUET_COMPRESSION = "zstd"
# Row groups of this many rows: readers (polars, pyarrow, dask) decode row groups in
# parallel and prune them on statistics, which one file-sized row group defeats.
ROW_GROUP_ROWS = 128 * 1024
_UMASK = os.umask(0)
os.umask(_UMASK)


# --------------------------------------------------------------------------- inputs


def resolve_inputs(sources: Iterable[str | os.PathLike], suffixes: tuple[str, ...] = (".parquet",)) -> list[Path]:
    """Expand files, directories (recursively, by suffix) and globs into a sorted file list.

    Raises `ConfigError` for a source that matches nothing.
    """
    out: list[Path] = []
    for src in sources:
        s = str(src)
        p = Path(s)
        if any(ch in s for ch in "*?["):
            matches = sorted(Path(m) for m in globlib.glob(s, recursive=True) if Path(m).is_file())
            if not matches:
                raise ConfigError(f"{s}: the pattern matches no file; check the path")
            out.extend(matches)
        elif p.is_dir():
            matches = sorted(
                f for f in p.rglob("*") if f.is_file() and f.name.endswith(suffixes) and not _hidden(f, p)
            )
            if not matches:
                raise ConfigError(f"{s}: the directory holds no {'/'.join(suffixes)} file")
            out.extend(matches)
        elif p.is_file():
            out.append(p)
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


def _hidden(f: Path, root: Path) -> bool:
    """Temporary files, done markers and hidden folders are never inputs."""
    rel = f.relative_to(root).parts
    return any(part.startswith((".", "_")) for part in rel)


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
    """Eager read as an Arrow table conformed to the canonical schema."""
    paths = resolve_inputs(sources)
    check_dataset_files(paths, dataset)
    tables = [conform(pq.read_table(p), dataset) for p in paths]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


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
    return json.loads(Path(path).read_text())


def read_yaml_mapping(path: str | os.PathLike, what: str = "settings") -> dict[str, Any]:
    """A YAML file that must hold a mapping; `ConfigError` naming the file otherwise."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
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
