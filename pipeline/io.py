"""Parquet/JSON I/O: validated dataset reads, atomic writes, hashes and manifests.

Naming follows polars: ``scan_*`` is lazy, ``read_*`` is eager, ``write_*``
writes. Every write goes to a temporary name in the destination folder and is
renamed into place, so a killed process never leaves a partial output file.
Finding the input files is `mentor.pipeline.inputs`; strict YAML settings are
`mentor.pipeline.yaml_io`.
"""

from __future__ import annotations

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

from mentor.pipeline.errors import ConfigError, CorruptFileError, DataError, SchemaError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.schemas import DOMAINS, SCHEMA_VERSION, SCHEMAS, conform, expected_schema, require_schema, schema_metadata

PARQUET_COMPRESSION = "zstd"
# Row groups of this many rows: readers (polars, pyarrow, dask) decode row groups in
# parallel and prune them on statistics, which one file-sized row group defeats.
ROW_GROUP_ROWS = 128 * 1024
_UMASK = os.umask(0)
os.umask(_UMASK)


# --------------------------------------------------------------------------- dataset reads


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
    expected = expected_schema(dataset, found)
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


# --------------------------------------------------------------------------- hashes and manifests


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


def files_hash(files: Iterable[tuple[str, str | os.PathLike]]) -> str:
    """Stable short hash of files' contents under their names: ``(name, path)`` pairs, in order."""
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()[:16]


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
    "cast_lazy",
    "check_dataset_files",
    "check_values",
    "commit_file",
    "config_hash",
    "parquet_writer_atomic",
    "read_dataset",
    "read_json",
    "read_parquet_schema",
    "read_table",
    "scan_dataset",
    "sha256_file",
    "temp_path_beside",
    "to_table",
    "write_json_atomic",
    "write_manifest",
    "write_parquet_atomic",
]
