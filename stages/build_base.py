"""Build's inputs: the base problem set and the hints, read and checked.

`load_base` resolves ``--base`` (a bundled name, a local Parquet/JSONL file or
folder, or ``hf:NAME[:CONFIG]:SPLIT``) into a frame of PROBLEMS columns;
`validate_base` drops and counts unusable rows; `load_hints` picks one hint per
problem. Every count and warning goes into the build's `Stats`.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mentor.data import BUNDLED_SETS as BUNDLED
from mentor.data import bundled
from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.inputs import jsonl_problem, resolve_inputs
from mentor.pipeline.io import check_dataset_files, read_parquet_schema
from mentor.pipeline.schemas import DOMAINS, check_schema
from mentor.pipeline.stage import Stats

PROBLEM_COLUMNS = ("problem_id", "domain", "problem", "label", "data_source")
REQUIRED_PROBLEM_COLUMNS = ("problem", "label")


@dataclass
class BaseSet:
    frame: pl.DataFrame  # problem_id, domain, problem, label, data_source (strings), base order
    where: str  # what to name in messages
    files: list[Path]  # local files read (hashed into the manifest)
    info: dict[str, Any]  # how it was resolved (kind, name, ...)
    name: str = "base"  # the set's name: data_source where the set gives none


def load_base(spec: str, mapping: dict[str, str] | None = None, domain: str = "math") -> BaseSet:
    """Resolve `spec` (bundled name, local file/dir, or ``hf:NAME[:CONFIG]:SPLIT``) into a problem frame."""
    mapping = dict(mapping or {})
    if spec in BUNDLED:
        path = bundled(BUNDLED[spec])
        frame = _from_problems_parquet([path], mapping, domain, spec)
        return BaseSet(frame, str(path), [path], {"kind": "bundled", "name": spec}, spec)
    if spec.startswith("hf:"):
        return _load_hf(spec, mapping, domain)
    if not Path(spec).exists() and "/" not in spec and not any(ch in spec for ch in "*?["):
        raise ConfigError(
            f"--base {spec}: no such file, and not a bundled set ({', '.join(BUNDLED)}); "
            "pass a Parquet/JSONL path or hf:NAME[:CONFIG]:SPLIT"
        )
    paths = resolve_inputs([spec], suffixes=(".parquet", ".jsonl", ".json"))
    kinds = {".parquet" if p.suffix == ".parquet" else ".jsonl" for p in paths}
    # The set's name (data_source where the set gives none): the file's or the
    # folder's stem; for a glob, the name of the folder it searches.
    name = Path(spec).stem if kinds == {".parquet"} else paths[0].stem
    if any(ch in name for ch in "*?["):
        name = Path(spec).parent.name or "base"
    if kinds == {".parquet"}:
        frame = _from_problems_parquet(paths, mapping, domain, name)
    elif len(paths) == 1:
        frame = _from_jsonl(paths[0], mapping, domain)
    else:
        raise ConfigError(f"--base {spec}: give one JSONL file, or Parquet files only (found {len(paths)} files of mixed kinds)")
    return BaseSet(frame, spec if len(paths) > 1 else str(paths[0]), paths, {"kind": "local", "path": spec}, name)


def _from_problems_parquet(paths: list[Path], mapping: dict[str, str], domain: str, source_name: str) -> pl.DataFrame:
    schemas = [read_parquet_schema(p) for p in paths]
    if not mapping and all(not check_schema(s, "problems") for s in schemas):
        # Canonical problems: validated (also across shards), then read eagerly;
        # only columns of another (compatible) type are cast.
        check_dataset_files(paths, "problems")
        frame = pl.scan_parquet([str(p) for p in paths]).select(PROBLEM_COLUMNS).collect()
        wrong = [c for c in PROBLEM_COLUMNS if frame.schema[c] != pl.String]
        return frame.with_columns(pl.col(c).cast(pl.String) for c in wrong) if wrong else frame
    names = set(schemas[0].names)
    for p, s in zip(paths[1:], schemas[1:]):
        if set(s.names) != names:
            raise DataError(f"{p}: columns differ from {paths[0]} ({sorted(set(s.names) ^ names)}); give files of one layout")
    # Only the columns the problem schema takes (DeepMath-103K carries three long R1 solutions a row).
    # (A lazy scan reads just those column chunks; read_parquet(columns=...) maps and touches the whole file.)
    frame = pl.scan_parquet([str(p) for p in paths]).select(_used_columns(schemas[0].names, mapping)).collect()
    return _apply_mapping(frame, mapping, domain, source_name, str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}",
                          list(schemas[0].names))


def _used_columns(names: list[str], mapping: dict[str, str]) -> list[str]:
    """The columns of a set that become problem columns (mapped or by their own name), in the set's order."""
    wanted = {mapping.get(c, c) for c in PROBLEM_COLUMNS} | set(mapping.values())
    return [n for n in names if n in wanted]


def _from_jsonl(path: Path, mapping: dict[str, str], domain: str) -> pl.DataFrame:
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); re-create it or pass another --base")
    try:
        with open(path, "rb") as fh:
            bom = fh.read(3) == b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which polars does not skip
        frame = pl.read_ndjson(io.BytesIO(path.read_bytes()[3:]) if bom else path, infer_schema_length=None)
    except Exception as exc:  # polars raises ComputeError for bad JSON / non-UTF-8 bytes / deep nesting
        where = jsonl_problem(path) or f"{path}: not readable as JSONL ({str(exc).splitlines()[0]})"
        raise DataError(f"{where}; fix the file or convert it to Parquet") from exc
    return _apply_mapping(frame, mapping, domain, path.stem, str(path))


def _load_hf(spec: str, mapping: dict[str, str], domain: str) -> BaseSet:
    parts = spec[3:].split(":")
    if len(parts) == 2:
        name, config, split = parts[0], None, parts[1]
    elif len(parts) == 3:
        name, config, split = parts
    else:
        raise ConfigError(f"--base {spec}: write hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT (e.g. hf:openai/gsm8k:main:test)")
    if not name or not split:
        raise ConfigError(f"--base {spec}: empty dataset name or split; write hf:NAME[:CONFIG]:SPLIT")
    try:
        import datasets  # optional (the datasets extra) and slow to import
    except ImportError as exc:
        raise ConfigError("--base hf:...: the `datasets` library is not installed; pip install 'mentor[datasets]'") from exc
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or os.environ.get(
        "HF_DATASETS_OFFLINE", "0"
    ).lower() in ("1", "true", "yes")
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many kinds (ConnectionError, DatasetNotFoundError, ValueError...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, ValueError) and "split" in str(exc).lower() and "unknown split" in str(exc).lower():
            raise ConfigError(f"--base {spec}: {first}") from exc
        where = "offline (HF_HUB_OFFLINE=1)" if offline else "and it could not be downloaded"
        raise DataError(
            f"--base {spec}: the Hugging Face dataset {name!r}"
            f"{f' (config {config!r})' if config else ''} split {split!r} is not in the local cache, {where}: "
            f"{type(exc).__name__}: {first}. Fix: on a machine with network run "
            f"`python -c \"import datasets; datasets.load_dataset({name!r}, {config!r}, split={split!r})\"` "
            "with the same HF_HOME, or export it to Parquet/JSONL and pass that file as --base"
        ) from exc
    table = ds.data.table  # memory-mapped Arrow: only the columns used are converted
    frame = pl.from_arrow(table.select(_used_columns(table.column_names, mapping)))
    if isinstance(frame, pl.Series):  # a one-column table comes back as a Series
        frame = frame.to_frame()
    frame = _apply_mapping(frame, mapping, domain, name, spec, table.column_names)
    files = [Path(f["filename"]) for f in getattr(ds, "cache_files", []) if "filename" in f]
    info = {"kind": "hf", "name": name, "config": config, "split": split, "fingerprint": getattr(ds, "_fingerprint", None)}
    return BaseSet(frame, spec, files, info, name)


def _apply_mapping(frame: pl.DataFrame, mapping: dict[str, str], domain: str, source_name: str, where: str,
                   all_columns: list[str] | None = None) -> pl.DataFrame:
    """Rename mapped columns to the problem schema; derive absent optional ones. `all_columns`: the set's columns
    when `frame` holds only those it uses (named in the messages)."""
    cols = set(all_columns if all_columns is not None else frame.columns)
    bad = {k: v for k, v in mapping.items() if v not in cols}
    if bad:
        k, v = next(iter(bad.items()))
        raise DataError(f"{where}: --map {k}={v}: column {v!r} not found (found: {', '.join(sorted(cols)[:12])})")
    src = {c: mapping.get(c, c) for c in PROBLEM_COLUMNS}
    missing = [c for c in REQUIRED_PROBLEM_COLUMNS if src[c] not in cols]
    if missing:
        suggest = {"problem": ("question", "prompt", "input", "problem_text"), "label": ("answer", "solution", "target", "output")}
        fix = " ".join(
            f"--map {c}=" + next((g for g in suggest[c] if g in cols), "<column>") for c in missing
        )
        raise DataError(
            f"{where}: not a problem set: column(s) {', '.join(repr(src[c]) for c in missing)} missing "
            f"(found: {', '.join(sorted(cols)[:12])}{', ...' if len(cols) > 12 else ''}); pass {fix} "
            "(problem_id, domain and data_source are optional)"
        )

    def text(name: str) -> pl.Expr:
        col = pl.col(src[name])
        # Non-string references (ints, nested JSON) become their JSON text.
        dtype = frame.schema[src[name]]
        if dtype == pl.String:
            return col.alias(name)
        if dtype.is_nested():
            return pl.struct(col.alias("v")).struct.json_encode().str.slice(5).str.head(-1).alias(name)
        return col.cast(pl.String).alias(name)

    exprs = [text("problem"), text("label")]
    exprs.append(text("domain") if src["domain"] in cols else pl.lit(domain, pl.String).alias("domain"))
    exprs.append(text("data_source") if src["data_source"] in cols else pl.lit(source_name, pl.String).alias("data_source"))
    out = frame.select(exprs)
    if src["problem_id"] in cols:
        out = out.with_columns(frame.select(text("problem_id")).to_series())
    else:
        # Same ids as ingest gives the rollouts of these problems (hash of the normalised text).
        out = out.with_columns(
            pl.col("problem").map_elements(text_id, return_dtype=pl.String, skip_nulls=True).alias("problem_id")
        )
    return out.select(PROBLEM_COLUMNS)


def _blank(col: str) -> pl.Expr:
    """Null, or nothing but (Unicode) whitespace."""
    return pl.col(col).is_null() | (pl.col(col).str.strip_chars() == "")


def validate_base(base: BaseSet, strict: bool, stats: Stats) -> pl.DataFrame:
    """Duplicates are an error; rows without id/problem/label or with an unknown (or null) domain are
    dropped and counted, a null data_source is set to the set's name and counted (errors when `strict`)."""
    df = base.frame
    if df.height == 0:
        raise DataError(f"{base.where}: the base problem set has no rows")
    reason = (
        pl.when(_blank("problem_id")).then(pl.lit("problem_id_missing"))
        .when(_blank("problem")).then(pl.lit("problem_missing"))
        .when(pl.col("label").is_null()).then(pl.lit("label_missing"))
        # A null domain is unknown too (is_in alone gives null there).
        .when(pl.col("domain").is_null() | ~pl.col("domain").is_in(list(DOMAINS))).then(pl.lit("domain_unknown"))
    )
    df = df.with_columns(_reason=reason)
    bad = df.filter(pl.col("_reason").is_not_null())
    for why, n in sorted(bad.group_by("_reason").len().iter_rows()):
        stats.add("base_dropped", n, reason=why)
        rows = bad.filter(pl.col("_reason") == why)
        msg = f"{base.where}: {n} base problem(s) dropped ({why}; e.g. problem_id {rows['problem_id'].head(5).to_list()})"
        if why == "domain_unknown":
            found = rows.get_column("domain").unique().sort().head(5).to_list()
            msg += f": domain {found} is not one of {', '.join(DOMAINS)}; fix the column or --map domain=<column>"
        if strict:
            raise DataError(msg + " (--strict)")
        stats.warn(msg)
    df = df.filter(pl.col("_reason").is_null()).drop("_reason")
    if df.height == 0:
        raise DataError(f"{base.where}: no usable base problems ({dict(stats.base_dropped)})")
    missing_source = df.get_column("data_source").null_count()
    if missing_source:
        ids = df.filter(pl.col("data_source").is_null()).get_column("problem_id").head(5).to_list()
        msg = (
            f"{base.where}: {missing_source} base problem(s) have no data_source (e.g. problem_id {ids}); "
            f"set to {base.name!r}, the set's name (--map data_source=<column> takes another column)"
        )
        if strict:
            raise DataError(msg + " (--strict)")
        stats.warn(msg)
        df = df.with_columns(pl.col("data_source").fill_null(base.name))
    dup = df.filter(pl.col("problem_id").is_duplicated()).get_column("problem_id").unique(maintain_order=True)
    if dup.len():
        raise DataError(
            f"{base.where}: {dup.len()} duplicate problem_id(s) in the base set "
            f"({', '.join(dup.head(5).to_list())}{', ...' if dup.len() > 5 else ''}); "
            "each problem must appear once: deduplicate the file or map a unique id column with --map problem_id=<column>"
        )
    return df


def load_hints(sources: list[str], statuses: list[str], stats: Stats) -> pl.DataFrame:
    """One hint per problem: problem_id, hint_round, hint_id, hint (the rules: `mentor.stages.build`'s docstring).

    Only hints whose status is in `statuses` are used; the others are counted.
    """
    empty = pl.DataFrame(schema={"problem_id": pl.String, "hint_round": pl.Int32, "hint_id": pl.String, "hint": pl.String})
    if not sources:
        stats.warn("no --hints given: every prompt is unhinted")
        return empty
    paths = resolve_inputs(sources)
    check_dataset_files(paths, "hints")  # every shard validated; then only the columns used are read
    df = pl.read_parquet([str(p) for p in paths], columns=["problem_id", "round", "hint_id", "hint", "status"]).select(
        pl.col("problem_id").cast(pl.String),
        pl.col("round").cast(pl.Int32).alias("hint_round"),
        pl.col("hint_id").cast(pl.String),
        pl.col("hint").cast(pl.String),
        pl.col("status").cast(pl.String),
    )
    stats.hints_rows = df.height
    if df.height == 0:
        stats.warn(f"hints {', '.join(sources)}: the hints set is empty: every prompt is unhinted")
        return empty
    # A hint without its problem_id, hint_id or round cannot be placed or traced
    # (the label carries hint_id to the next round's rollouts).
    ided = df.filter(pl.col("problem_id").is_not_null() & pl.col("hint_id").is_not_null() & pl.col("hint_round").is_not_null())
    stats.hints_missing_ids = df.height - ided.height
    if stats.hints_missing_ids:
        stats.warn(
            f"hints {', '.join(sources)}: {stats.hints_missing_ids} hint(s) skipped: null problem_id, hint_id or round "
            "(every hint needs all three; fill them or re-run `mentor hint`)"
        )
    keep = ided.filter(pl.col("status").is_in(statuses))
    stats.hints_skipped_status = ided.height - keep.height
    if stats.hints_skipped_status:
        stats.warn(f"{stats.hints_skipped_status} hint(s) skipped: status not in {statuses}")
    usable = keep.filter(pl.col("hint").is_not_null() & (pl.col("hint").str.strip_chars() != ""))
    stats.hints_empty_text = keep.height - usable.height
    if stats.hints_empty_text:
        stats.warn(f"{stats.hints_empty_text} hint(s) skipped: empty hint text")
    # The same hint listed twice (e.g. a file passed twice) is not a conflict.
    distinct = usable.unique(subset=["problem_id", "hint_round", "hint_id"], keep="first", maintain_order=True)
    stats.hints_duplicate_rows = usable.height - distinct.height
    latest = distinct.filter(pl.col("hint_round") == pl.col("hint_round").max().over("problem_id"))
    stats.hints_superseded = distinct.height - latest.height
    clash = latest.filter(pl.col("problem_id").is_duplicated())
    if clash.height:
        ids = clash.get_column("problem_id").unique(maintain_order=True)
        raise DataError(
            f"hints {', '.join(sources)}: {ids.len()} problem(s) have more than one hint in the same round "
            f"({', '.join(ids.head(5).to_list())}); pass one hints set per round (the latest round wins across rounds)"
        )
    if stats.hints_superseded:
        stats.warn(f"{stats.hints_superseded} older hint(s) superseded by a later round's hint for the same problem")
    return latest.select("problem_id", pl.col("hint_round").cast(pl.Int32), "hint_id", "hint")
