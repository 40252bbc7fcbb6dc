"""Build: base problem set + hints -> next-epoch prompt shards (schema: prompts).

Every problem of the base set gets a prompt; a problem with a hint gets the
hint in its user message, before the problem. The shards serve OpenRLHF and
verl without edits:

- ``prompt``: chat messages ``[{role, content}, ...]`` (an optional system
  message, then the user message: hint block + problem + the domain's
  instruction);
- ``label``: the JSON string of `schemas.prompt_label` (reference answer or
  tests + ``problem_id``, ``hint_id``, ``round``): OpenRLHF hands only this
  column to the reward function;
- verl's ``data_source``, ``ability``, ``reward_model {style, ground_truth}``,
  ``extra_info {problem_id, hint_id, round, index}``;
- convenience copies ``problem_id``, ``hint_id``, ``round`` for polars.

Choices (documented in the README):

- Row order: the base set's order (``--mode both``: a problem's unhinted row,
  then its hinted one). ``--seed S`` shuffles the rows by a splitmix64 key of
  (row number, S): plain integer arithmetic that no library upgrade changes. Either way the same inputs give byte-identical
  shards. No shuffle is the default because both trainers shuffle their
  dataloader with their own seed.
- Several hints for one problem (e.g. hints of rounds 0 and 1 passed
  together): the latest round wins and the others are counted as
  ``hints_superseded``; two *different* hints of the same problem and round
  are an error (which one the user meant cannot be guessed).
- ``--round``: the round the prompts are for (stamped into label and
  extra_info). Default: the latest hint round + 1 (hints are made from round
  r's rollouts for round r+1), or 0 without hints.
- The shard directory also gets a ``README.md`` dataset card whose YAML
  ``configs`` name the shards, so ``datasets.load_dataset(DIR)`` (which
  OpenRLHF runs on a directory) reads the shards and not ``manifest.json``.

Everything row-wise is a polars expression; the only per-row Python is the
label of *code* problems (their reference is itself JSON; code sets are small)
and ``text_id`` for base sets without a problem id column.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import re
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import (
    PARQUET_COMPRESSION,
    atomic_path,
    check_dataset_files,
    commit_file,
    jsonl_problem,
    read_parquet_schema,
    resolve_inputs,
    sha256_file,
    temp_path_beside,
    write_json_atomic,
    write_manifest,
)
from mentor.data import BUNDLED_SETS as BUNDLED
from mentor.pipeline.outdir import check_output_dir, staged_output_dir
from mentor.pipeline.prompts import HINT_TEMPLATE, INSTRUCTIONS
from mentor.pipeline.schemas import DOMAINS, HINT_STATUSES, PROMPTS, SCHEMA_VERSION, check_schema, prompt_label, schema_metadata

log = logging.getLogger(__name__)

PROBLEM_COLUMNS = ("problem_id", "domain", "problem", "label", "data_source")
REQUIRED_PROBLEM_COLUMNS = ("problem", "label")
DEFAULT_TEMPLATE = HINT_TEMPLATE
DEFAULT_PLAIN_TEMPLATE = "{problem}"
DEFAULT_INSTRUCTIONS = INSTRUCTIONS
DEFAULT_SHARD_ROWS = 100_000
PLACEHOLDERS = ("hint", "problem", "instruction")
_PLACEHOLDER_RE = re.compile(r"\{(hint|problem|instruction)\}")
SHARD_RE = re.compile(r"^part-\d{5}\.parquet$")


class BuildConfig(BaseModel):
    """Settings of `mentor build` (also the `build:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(
        description="Base problem set: a bundled name (gsm8k, math500, humaneval), a Parquet/JSONL file or directory, "
        "or hf:NAME[:CONFIG]:SPLIT (a Hugging Face dataset in the local cache)."
    )
    hints: list[str] = Field(default_factory=list, description="Hints datasets (files, directories or globs); none = unhinted prompts.")
    mapping: dict[str, str] = Field(
        default_factory=dict, description="Base-set column mapping canonical=column (problem, label, problem_id, domain, data_source)."
    )
    domain: Literal["math", "code"] = Field("math", description="Domain of base problems whose set has no domain column.")
    answer_after: str | None = Field(
        None,
        description="Keep only the text after the last occurrence of this marker in the base label "
        "(e.g. '####' for GSM8K solutions: the label becomes the final answer).",
    )
    mode: Literal["prefix", "both"] = Field(
        "prefix", description="prefix: a hinted problem gets only its hinted prompt; both: its unhinted prompt is kept beside it."
    )
    round: int | None = Field(
        None, ge=0, le=2**31 - 2, description="Round the prompts are for (label/extra_info). Default: latest hint round + 1, or 0 without hints."
    )
    template: str = Field(
        DEFAULT_TEMPLATE, description="User message of a hinted problem; placeholders {hint}, {problem}, optional {instruction}."
    )
    plain_template: str = Field(
        DEFAULT_PLAIN_TEMPLATE, description="User message of an unhinted problem; placeholders {problem}, optional {instruction}."
    )
    system_prompt: str | None = Field(None, description="Optional system message placed before the user message.")
    instructions: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_INSTRUCTIONS),
        description="Per-domain instruction appended to the user message (after a blank line) unless the template places "
        "{instruction} itself; an empty string disables it.",
    )
    hint_statuses: list[Literal["accepted", "repaired", "fallback"]] = Field(
        default_factory=lambda: list(HINT_STATUSES), description="Hint statuses to use; others are counted and skipped."
    )
    seed: int | None = Field(None, description="Shuffle the rows with this seed (default: keep the base set's order).")
    shard_rows: int | None = Field(None, ge=1, le=2**31 - 1, description=f"Rows per shard (default {DEFAULT_SHARD_ROWS} when --shard-bytes is not set).")
    shard_bytes: int | None = Field(
        None, ge=1024, le=1 << 50, description="Target uncompressed Arrow bytes per shard (files on disk are smaller: zstd)."
    )
    strict: bool = Field(False, description="Turn counted warnings (unmatched hints, unusable base rows) into errors.")

    @model_validator(mode="after")
    def _check(self) -> "BuildConfig":
        if self.shard_rows is not None and self.shard_bytes is not None:
            raise ValueError("give --shard-rows or --shard-bytes, not both")
        for name, text, needs, forbids in (
            ("template", self.template, ("hint", "problem"), ()),
            ("plain_template", self.plain_template, ("problem",), ("hint",)),
        ):
            found = set(_PLACEHOLDER_RE.findall(text))
            missing = [p for p in needs if p not in found]
            if missing:
                raise ValueError(f"{name} lacks the placeholder(s) {', '.join('{' + m + '}' for m in missing)}")
            bad = [p for p in forbids if p in found]
            if bad:
                raise ValueError(f"{name} must not use {', '.join('{' + b + '}' for b in bad)}")
        unknown = sorted(set(self.instructions) - set(DOMAINS))
        if unknown:
            raise ValueError(f"instructions for unknown domain(s) {unknown}; domains are {', '.join(DOMAINS)}")
        bad_map = sorted(set(self.mapping) - set(PROBLEM_COLUMNS))
        if bad_map:
            raise ValueError(f"--map {bad_map[0]}=...: not a problem column; map one of {', '.join(PROBLEM_COLUMNS)}")
        return self

    def rows_per_shard(self, table_rows: int, table_bytes: int) -> int:
        if self.shard_bytes is not None:
            per_row = max(1, table_bytes // max(1, table_rows))
            return max(1, self.shard_bytes // per_row)
        return self.shard_rows or DEFAULT_SHARD_ROWS


@dataclass
class BuildStats:
    rows: int = 0
    hinted_rows: int = 0
    unhinted_rows: int = 0
    base_problems: int = 0
    hinted_problems: int = 0
    hints_rows: int = 0
    hints_used: int = 0
    hints_unmatched: int = 0
    hints_superseded: int = 0
    hints_duplicate_rows: int = 0
    hints_skipped_status: int = 0
    hints_empty_text: int = 0
    hints_missing_ids: int = 0
    base_dropped: Counter = field(default_factory=Counter)
    shards: int = 0
    round: int = 0
    mode: str = "prefix"
    seed: int | None = None
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "hinted_rows": self.hinted_rows,
            "unhinted_rows": self.unhinted_rows,
            "hinted_share": round(self.hinted_rows / self.rows, 6) if self.rows else 0.0,
            "base_problems": self.base_problems,
            "hinted_problems": self.hinted_problems,
            "hints_rows": self.hints_rows,
            "hints_used": self.hints_used,
            "hints_unmatched": self.hints_unmatched,
            "hints_superseded": self.hints_superseded,
            "hints_duplicate_rows": self.hints_duplicate_rows,
            "hints_skipped_status": self.hints_skipped_status,
            "hints_empty_text": self.hints_empty_text,
            "hints_missing_ids": self.hints_missing_ids,
            "base_dropped": dict(sorted(self.base_dropped.items())),
            "shards": self.shards,
            "round": self.round,
            "mode": self.mode,
            "seed": self.seed,
            "warnings": list(self.warnings),
        }

    def add_hint_counts(self, other: "BuildStats") -> None:
        """Take the counters and warnings of `load_hints` run with its own stats."""
        for name in (
            "hints_rows", "hints_missing_ids", "hints_skipped_status", "hints_empty_text", "hints_duplicate_rows", "hints_superseded",
        ):
            setattr(self, name, getattr(other, name))
        self.warnings.extend(other.warnings)

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)


@dataclass
class BaseSet:
    frame: pl.DataFrame  # problem_id, domain, problem, label, data_source (strings), base order
    where: str  # what to name in messages
    files: list[Path]  # local files read (hashed into the manifest)
    info: dict[str, Any]  # how it was resolved (kind, name, ...)
    name: str = "base"  # the set's name: data_source where the set gives none


# --------------------------------------------------------------------------- base set


def load_base(spec: str, mapping: dict[str, str] | None = None, domain: str = "math") -> BaseSet:
    """Resolve `spec` (bundled name, local file/dir, or ``hf:NAME[:CONFIG]:SPLIT``) into a problem frame."""
    mapping = dict(mapping or {})
    if spec in BUNDLED:
        from mentor.data import bundled

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
        frame = pl.read_parquet([str(p) for p in paths], columns=list(PROBLEM_COLUMNS))
        wrong = [c for c in PROBLEM_COLUMNS if frame.schema[c] != pl.String]
        return frame.with_columns(pl.col(c).cast(pl.String) for c in wrong) if wrong else frame
    names = set(schemas[0].names)
    for p, s in zip(paths[1:], schemas[1:]):
        if set(s.names) != names:
            raise DataError(f"{p}: columns differ from {paths[0]} ({sorted(set(s.names) ^ names)}); give files of one layout")
    frame = pl.read_parquet([str(p) for p in paths])
    return _apply_mapping(frame, mapping, domain, source_name, str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}")


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
        import datasets
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
    frame = pl.from_arrow(ds.data.table)
    if isinstance(frame, pl.Series):  # a one-column table comes back as a Series
        frame = frame.to_frame()
    frame = _apply_mapping(frame, mapping, domain, name, spec)
    files = [Path(f["filename"]) for f in getattr(ds, "cache_files", []) if "filename" in f]
    info = {"kind": "hf", "name": name, "config": config, "split": split, "fingerprint": getattr(ds, "_fingerprint", None)}
    return BaseSet(frame, spec, files, info, name)


def _apply_mapping(frame: pl.DataFrame, mapping: dict[str, str], domain: str, source_name: str, where: str) -> pl.DataFrame:
    """Rename mapped columns to the problem schema; derive absent optional ones."""
    cols = set(frame.columns)
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


# Every character Python calls whitespace (none lies above U+3000): a superset
# of what strip_chars() strips (Unicode White_Space), so the screen below
# misses no blank problem.
_WHITESPACE = [c for c in map(chr, range(0x3001)) if c.isspace()]


def _blank(col: str) -> pl.Expr:
    return pl.col(col).is_null() | (pl.col(col).str.strip_chars() == "")


# A null domain is unknown too (is_in alone gives null there, which a filter skips).
_BAD_DOMAIN = pl.col("domain").is_null() | ~pl.col("domain").is_in(list(DOMAINS))


def validate_base(base: BaseSet, cfg: BuildConfig, stats: BuildStats) -> pl.DataFrame:
    """Duplicates are an error; rows without id/problem/label or with an unknown (or null) domain are
    dropped and counted, a null data_source is set to the set's name and counted (errors with --strict)."""
    df = base.frame
    if df.height == 0:
        raise DataError(f"{base.where}: the base problem set has no rows")
    # Cheap screen first: only rows that may be unusable (null, empty, or a
    # problem starting with whitespace: possibly blank) are looked at closely,
    # so a clean 1M-row set costs a few vectorised passes and no copy (a
    # one-character head is inlined in its string view; stripping every
    # problem copies them all; an anchored regex costs a third more).
    suspect = (
        pl.col("problem_id").is_null()
        | (pl.col("problem_id").str.len_bytes() == 0)
        | pl.col("problem").is_null()
        | (pl.col("problem").str.len_bytes() == 0)
        | pl.col("problem").str.head(1).is_in(_WHITESPACE)
        | pl.col("label").is_null()
        | _BAD_DOMAIN
    )
    reason = (
        pl.when(_blank("problem_id"))
        .then(pl.lit("problem_id_missing"))
        .when(_blank("problem"))
        .then(pl.lit("problem_missing"))
        .when(pl.col("label").is_null())
        .then(pl.lit("label_missing"))
        .when(_BAD_DOMAIN)
        .then(pl.lit("domain_unknown"))
        .otherwise(None)
    )
    # One select: the screen and the ids' hashes run in parallel.
    any_suspect, distinct_hashes = df.select(suspect.any().alias("suspect"), pl.col("problem_id").hash().n_unique()).row(0)
    bad = df.head(0)
    if any_suspect:
        bad = df.with_row_index("_row").filter(suspect).with_columns(_reason=reason).filter(pl.col("_reason").is_not_null())
    if bad.height:
        for why, n in sorted(bad.group_by("_reason").len().iter_rows()):
            stats.base_dropped[why] += n
            ids = bad.filter(pl.col("_reason") == why).get_column("problem_id").head(5).to_list()
            msg = f"{base.where}: {n} base problem(s) dropped ({why}; e.g. problem_id {ids})"
            if why == "domain_unknown":
                found = bad.filter(pl.col("_reason") == why).get_column("domain").unique().sort().head(5).to_list()
                msg += f": domain {found} is not one of {', '.join(DOMAINS)}; fix the column or --map domain=<column>"
            if cfg.strict:
                raise DataError(msg + " (--strict)")
            stats.warn(msg)
        drop = bad.get_column("_row")
        df = df.with_row_index("_row").filter(~pl.col("_row").is_in(drop.implode())).drop("_row")
        if df.height == 0:
            raise DataError(f"{base.where}: no usable base problems ({dict(stats.base_dropped)})")
        distinct_hashes = df.get_column("problem_id").hash().n_unique()
    missing_source = df.get_column("data_source").null_count()
    if missing_source:
        ids = df.filter(pl.col("data_source").is_null()).get_column("problem_id").head(5).to_list()
        msg = (
            f"{base.where}: {missing_source} base problem(s) have no data_source (e.g. problem_id {ids}); "
            f"set to {base.name!r}, the set's name (--map data_source=<column> takes another column)"
        )
        if cfg.strict:
            raise DataError(msg + " (--strict)")
        stats.warn(msg)
        df = df.with_columns(pl.col("data_source").fill_null(base.name))
    ids = df.get_column("problem_id")
    # Distinct 64-bit hashes prove distinct ids (a cheap integer n_unique); only
    # when two hashes meet is the exact (string) check run.
    if distinct_hashes != df.height and ids.n_unique() != df.height:
        ids = df.filter(pl.col("problem_id").is_duplicated()).get_column("problem_id").unique(maintain_order=True)
        raise DataError(
            f"{base.where}: {ids.len()} duplicate problem_id(s) in the base set "
            f"({', '.join(ids.head(5).to_list())}{', ...' if ids.len() > 5 else ''}); "
            "each problem must appear once: deduplicate the file or map a unique id column with --map problem_id=<column>"
        )
    return df


# --------------------------------------------------------------------------- hints


def load_hints(sources: list[str], cfg: BuildConfig, stats: BuildStats) -> pl.DataFrame:
    """One hint per problem: problem_id, hint_round, hint_id, hint (see module docstring for the rules)."""
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
    keep = ided.filter(pl.col("status").is_in(cfg.hint_statuses))
    stats.hints_skipped_status = ided.height - keep.height
    if stats.hints_skipped_status:
        stats.warn(f"{stats.hints_skipped_status} hint(s) skipped: status not in {cfg.hint_statuses}")
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


# --------------------------------------------------------------------------- prompt rendering


Part = str | pl.Expr  # a literal or a column expression


def _parts(template: str, instruction: str | pl.Expr) -> list[Part]:
    """A template as literals and expressions ({hint}, {problem}, {instruction}); braces
    elsewhere stay literal (LaTeX is safe). Neighbouring literals are merged."""
    block: Part
    if isinstance(instruction, str):
        block = "\n\n" + instruction if instruction else ""
    else:
        block = pl.when(instruction == "").then(pl.lit("")).otherwise(pl.concat_str([pl.lit("\n\n"), instruction]))
    out: list[Part] = []
    for i, chunk in enumerate(_with_instruction(template).split("{__instruction_block}")):
        if i:
            out.append(block)
        pos = 0
        for m in _PLACEHOLDER_RE.finditer(chunk):
            out.append(chunk[pos : m.start()])
            name = m.group(1)
            out.append(instruction if name == "instruction" else pl.col(name))
            pos = m.end()
        out.append(chunk[pos:])
    return _merge_literals(out)


def _merge_literals(parts: list[Part]) -> list[Part]:
    """Neighbouring literals joined, empty ones dropped (fewer inputs to concat_str)."""
    out: list[Part] = []
    for x in parts:
        if isinstance(x, str) and out and isinstance(out[-1], str):
            out[-1] += x
        elif not (isinstance(x, str) and x == ""):
            out.append(x)
    return out


def _concat(parts: list[Part]) -> pl.Expr:
    """The parts joined per row (null where an expression is null), as one `pl.format`: its
    literals stay in the format string instead of being broadcast to columns as concat_str's
    are (15-20% less CPU for a label or a user message)."""
    exprs = [p for p in parts if isinstance(p, pl.Expr)]
    if not exprs:
        return pl.lit("".join(parts))  # type: ignore[arg-type]
    if len(parts) == 1:
        return exprs[0]
    fmt = "".join("{}" if isinstance(p, pl.Expr) else p.replace("{", "{{").replace("}", "}}") for p in parts)
    return pl.format(fmt, *exprs)


def _with_instruction(template: str) -> str:
    # The instruction goes after a blank line unless the template places it.
    return template if "{instruction}" in template else template + "{__instruction_block}"


def _split_at_problem(parts: list[Part]) -> tuple[list[Part], list[Part]] | None:
    idx = [i for i, p in enumerate(parts) if isinstance(p, pl.Expr) and p.meta.output_name(raise_if_undetermined=False) == "problem"]
    if len(idx) != 1:
        return None
    return parts[: idx[0]], parts[idx[0] + 1 :]


def _render_user(cfg: BuildConfig, instruction: str | pl.Expr) -> pl.Expr:
    """The user message: hinted template where hint_id is set, plain template elsewhere.

    Both templates are split at {problem}; only the short parts around the
    problem are chosen per row, and the (long) problem text is concatenated
    once — a when/then over two full renders costs several times more.
    """
    hinted = pl.col("hint_id").is_not_null()
    h_parts, p_parts = _parts(cfg.template, instruction), _parts(cfg.plain_template, instruction)
    h, p = _split_at_problem(h_parts), _split_at_problem(p_parts)

    def pick(h_side: list[Part], p_side: list[Part]) -> Part:
        if all(isinstance(x, str) for x in h_side + p_side) and "".join(h_side) == "".join(p_side):  # type: ignore[arg-type]
            return "".join(h_side)  # type: ignore[arg-type]
        if any(isinstance(x, pl.Expr) and x.meta.output_name(raise_if_undetermined=False) == "hint" for x in h_side):
            # `hint` is null exactly on unhinted rows, so the hinted side is null there.
            return _concat(h_side).fill_null(_concat(p_side))
        return pl.when(hinted).then(_concat(h_side)).otherwise(_concat(p_side))

    if h is not None and p is not None:
        return _concat([pick(h[0], p[0]), pl.col("problem"), pick(h[1], p[1])])
    return pl.when(hinted).then(_concat(h_parts)).otherwise(_concat(p_parts))


# What JSON must escape: control characters, quote, backslash. contains_any
# (one Aho-Corasick pass) costs a third to a half less than the equivalent regex.
_JSON_ESCAPED = ['"', "\\", *map(chr, range(0x20))]


def _json_str(col: str, escapes: bool, nulls: bool) -> list[Part]:
    """JSON text of a string column (null -> null), byte-equal to json.dumps(..., ensure_ascii=False),
    as template parts for `_concat`; `escapes`/`nulls`: whether some value of the whole set needs
    escaping / is null (`_set_facts`).

    A column without nulls and with nothing to escape (ids, most answers) is
    just quoted, and the quotes merge into the neighbouring literals, so the
    label is one flat concatenation (a nested one per column costs ~3x more).
    Otherwise the value is one nested expression: quoted with a null fill, or
    (when some value has a quote, backslash or control character) serde's
    encoder via struct.json_encode.
    """
    if escapes:
        return [pl.struct(pl.col(col).alias("v")).struct.json_encode().str.slice(5).str.head(-1)]
    if nulls:
        return [_concat(['"', pl.col(col), '"']).fill_null(pl.lit("null"))]
    return ['"', pl.col(col), '"']


def _math_label(facts: dict, round_: int) -> pl.Expr:
    """schemas.prompt_label for math rows, vectorised: same keys, order and separators."""

    def value(col: str) -> list[Part]:
        return _json_str(col, facts[f"{col}:escapes"], facts[f"{col}:nulls"] > 0)

    # Used for math rows only (code rows get their own label), so "domain" is a literal.
    parts: list[Part] = [
        '{"answer": ', *value("label"),
        ', "domain": "math", "hint_id": ', *value("hint_id"),
        ', "problem_id": ', *value("problem_id"),
        f', "round": {int(round_)}}}',
    ]
    return _concat(_merge_literals(parts))


def _code_labels(df: pl.DataFrame, round_: int, where: str) -> pl.Series:
    """Per-row prompt_label for code rows: their reference is JSON to merge (code sets are small)."""
    out = []
    for pid, hid, ref in df.select("problem_id", "hint_id", "label").iter_rows():
        try:
            out.append(prompt_label("code", ref, pid, hid, round_))
        except (ValueError, TypeError) as exc:
            raise DataError(
                f"{where}: problem {pid}: label is not a code label JSON ({exc}); "
                "code labels are schemas.code_label(tests, entry_point, kind)"
            ) from exc
    return pl.Series("_code_label", out, dtype=pl.String)


_U64 = pl.UInt64
_M64 = 1 << 64


def shuffle_key(seed: int) -> pl.Expr:
    """splitmix64 of (row number, seed): a per-row sort key that gives a seeded permutation.

    Plain integer arithmetic (wrapping u64), so the order is the same on every
    platform and polars/NumPy version — unlike hash() or shuffle(), whose
    streams may change between releases. splitmix64 is a bijection, so keys never tie.
    """
    z = (pl.int_range(pl.len(), dtype=_U64) + 1) * pl.lit(0x9E3779B97F4A7C15, _U64) + pl.lit(seed % _M64, _U64)
    z = (z ^ (z // pl.lit(1 << 30, _U64))) * pl.lit(0xBF58476D1CE4E5B9, _U64)
    z = (z ^ (z // pl.lit(1 << 27, _U64))) * pl.lit(0x94D049BB133111EB, _U64)
    return z ^ (z // pl.lit(1 << 31, _U64))


def prepare_rows(
    base: pl.DataFrame, hints: pl.DataFrame, cfg: BuildConfig, round_: int, stats: BuildStats, where: str = "base"
) -> pl.DataFrame:
    """Base problems joined with their hints, in final row order, with ``index`` (and code labels).

    Everything that needs the whole set (hint matching, --mode both, the seeded
    order, the row index) happens here; `render_exprs` then renders any slice.
    """
    joined = base.join(hints.select("problem_id", "hint_id", "hint"), on="problem_id", how="left", maintain_order="left")
    # Base ids and hint ids are both unique here, so matched hints = hinted base rows.
    matched = int(joined.get_column("hint_id").is_not_null().sum())
    stats.hints_used = matched
    stats.hints_unmatched = hints.height - matched
    if stats.hints_unmatched:
        ids = hints.join(base.select("problem_id"), on="problem_id", how="anti").get_column("problem_id").head(5).to_list()
        msg = f"{stats.hints_unmatched} hint(s) for problem ids not in the base set {where} (e.g. {ids}); they are not used"
        if cfg.strict:
            raise DataError(msg + " (--strict); build against the base set the hints were made for")
        stats.warn(msg)
    if cfg.mode == "both":
        joined = joined.with_row_index("_order")
        plain = joined.with_columns(pl.lit(None, pl.String).alias("hint_id"), pl.lit(None, pl.String).alias("hint"), pl.lit(0, pl.UInt8).alias("_variant"))
        hinted = joined.filter(pl.col("hint_id").is_not_null()).with_columns(pl.lit(1, pl.UInt8).alias("_variant"))
        rows = pl.concat([plain, hinted]).sort("_order", "_variant").drop("_variant", "_order")
    else:
        rows = joined
    if cfg.seed is not None:
        rows = rows.with_columns(shuffle_key(cfg.seed).alias("_key")).sort("_key").drop("_key")
    rows = rows.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("index"), pl.all())
    if (rows.get_column("domain") == "code").any():
        code = rows.filter(pl.col("domain") == "code")
        code_labels = code.select("index").with_columns(_code_labels(code, round_, where))
        rows = rows.join(code_labels, on="index", how="left", maintain_order="left")
    stats.rows = rows.height
    stats.hinted_rows = int(rows.get_column("hint_id").is_not_null().sum())
    stats.unhinted_rows = stats.rows - stats.hinted_rows
    stats.hinted_problems = stats.hinted_rows
    return rows


def instruction_for(domains: list[str], cfg: BuildConfig) -> str | pl.Expr:
    """The domain instruction: a literal when the set has one domain (the usual case), else an expression."""
    if len(domains) == 1:
        return cfg.instructions.get(domains[0], "")
    instruction = pl.lit("")
    for dom, text in cfg.instructions.items():
        instruction = pl.when(pl.col("domain") == dom).then(pl.lit(text)).otherwise(instruction)
    return instruction


_LABEL_COLUMNS = ("label", "hint_id", "problem_id")


def _set_facts(rows: pl.DataFrame) -> dict:
    """What rendering needs to know about the whole set, in one select (its scans run in
    parallel): which label columns have values to JSON-escape or nulls, and the domains."""
    exprs = [pl.col(c).str.contains_any(_JSON_ESCAPED).any().alias(f"{c}:escapes") for c in _LABEL_COLUMNS]
    exprs += [pl.col(c).null_count().alias(f"{c}:nulls") for c in _LABEL_COLUMNS]
    exprs.append(pl.col("domain").unique().sort().implode().alias("domains"))
    return rows.select(exprs).row(0, named=True)


def render_exprs(rows: pl.DataFrame, cfg: BuildConfig, round_: int) -> list[pl.Expr]:
    """The PROMPTS columns as expressions over `prepare_rows`'s output.

    Made once from the whole set (which instruction, which label columns need
    JSON escapes: `_set_facts`) and then applied to every shard's slice, which
    needs no checks of its own.
    """
    facts = _set_facts(rows)
    messages = []
    if cfg.system_prompt:
        messages.append(pl.struct(role=pl.lit("system"), content=pl.lit(cfg.system_prompt)))
    messages.append(pl.struct(role=pl.lit("user"), content=_render_user(cfg, instruction_for(facts["domains"], cfg))))
    label = _math_label(facts, round_)
    if "_code_label" in rows.columns:
        label = pl.when(pl.col("domain") == "code").then(pl.col("_code_label")).otherwise(label)
    rnd = pl.lit(round_, pl.Int32)
    return [
        pl.concat_list(messages).alias("prompt"),
        label.alias("label"),
        pl.col("data_source"),
        pl.col("data_source").alias("datasource"),  # OpenRLHF's per-source metrics read this name
        pl.col("domain").alias("ability"),
        pl.struct(style=pl.lit("rule"), ground_truth=pl.col("label")).alias("reward_model"),
        pl.struct(pl.col("problem_id"), pl.col("hint_id"), rnd.alias("round"), pl.col("index")).alias("extra_info"),
        pl.col("problem_id"),
        pl.col("hint_id"),
        rnd.alias("round"),
    ]


def build_prompts(base: pl.DataFrame, hints: pl.DataFrame, cfg: BuildConfig, round_: int, stats: BuildStats, where: str = "base") -> pl.DataFrame:
    """The whole prompts frame (PROMPTS columns) in final row order (`build` renders it shard by shard)."""
    rows = prepare_rows(base, hints, cfg, round_, stats, where)
    return rows.select(render_exprs(rows, cfg, round_))


def estimated_bytes(rows: pl.DataFrame, cfg: BuildConfig) -> int:
    """Approximate uncompressed size of the rendered prompts (for --shard-bytes), from string lengths."""
    def total(col: str) -> int:
        return int(rows.get_column(col).str.len_bytes().sum() or 0)

    fixed = len(cfg.template) + len(cfg.system_prompt or "") + max((len(t) for t in cfg.instructions.values()), default=0) + 120
    return total("problem") + total("hint") + 2 * total("label") + 3 * total("problem_id") + 2 * total("hint_id") + rows.height * fixed


def _as_views(dtype: pa.DataType) -> pa.DataType:
    """`dtype` with every string field as string_view."""
    if pa.types.is_string(dtype):
        return pa.string_view()
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(_as_views(f.type)) for f in dtype])
    if pa.types.is_list(dtype):
        # pyarrow's Parquet writer slices string views under a list only when the
        # list's element is non-nullable (PROMPTS' messages are).
        return pa.list_(dtype.value_field.with_type(_as_views(dtype.value_type)))
    return dtype


# Shards are written from string_view columns, polars' own string layout,
# exported without a copy (a plain-string export copies every value once more:
# about 0.3 s and 50k page faults per million prompts on our 2-core machine,
# and the message contents another 0.1-0.2 s).
# The values in the file are the same Parquet UTF8 byte arrays either way; the
# Arrow schema stored in the footer (ARROW:schema, which pyarrow and so
# datasets restore on read) is PROMPTS, so readers get plain strings, and the
# file is byte-identical to a plain-string write (test_build checks both).
WRITE_SCHEMA = pa.schema([f.with_type(_as_views(f.type)) for f in PROMPTS])
FILE_METADATA = schema_metadata("prompts") | {
    b"ARROW:schema": base64.b64encode(pa.schema(list(PROMPTS), metadata=schema_metadata("prompts")).serialize().to_pybytes())
}


# --------------------------------------------------------------------------- writing


def dataset_card(shards: list[str], stats: BuildStats, digests: list[str] | None = None) -> str:
    """README.md of the shard directory: its YAML `configs` make load_dataset(DIR) read only the shards.

    The config is named after the shards' content digest: `datasets` keys its
    cache of a directory on the card's configs (not on the files' mtimes), so a
    rebuild in place with other content must change it, or `load_dataset(DIR)`
    (what OpenRLHF calls) returns the rows of the earlier build.
    """
    digest = hashlib.sha256("".join(digests or []).encode()).hexdigest()[:16]
    return (
        "---\n"
        "configs:\n"
        f"- config_name: prompts-{digest}\n"
        "  default: true\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: part-*.parquet\n"
        "---\n"
        "# mentor prompt shards\n\n"
        f"{stats.rows} prompts ({stats.hinted_rows} hinted) for round {stats.round}, "
        f"schema `prompts` v{SCHEMA_VERSION}, in {len(shards)} shard(s) `part-NNNNN.parquet`.\n"
        "`manifest.json` lists each shard's rows and sha256; `stats.json` the build's counters.\n"
        f"Content digest: `{digest}`.\n\n"
        "- OpenRLHF: `--data.prompt_dataset <this dir> --data.input_key prompt --data.label_key label "
        "--data.apply_chat_template`\n"
        "- verl: `data.train_files` = the shard files\n"
        "- polars: `pl.scan_parquet('<this dir>/part-*.parquet')`\n"
    )


# Writer settings. Dictionary encoding only where values repeat (hashing a
# million unique prompts for a dictionary that is then abandoned costs ~30% of
# the write; ids, problem's and hint's alike, never repeat); statistics only on
# short columns that polars can prune on.
DICTIONARY_COLUMNS = [
    "prompt.list.element.role", "data_source", "datasource", "ability", "reward_model.style", "reward_model.ground_truth",
    "extra_info.round", "round",
]
STATISTICS_COLUMNS = [
    "data_source", "ability", "extra_info.problem_id", "extra_info.hint_id", "extra_info.round", "extra_info.index",
    "problem_id", "hint_id", "round",
]


def write_shard(part: pl.DataFrame, tmp: Path) -> str:
    """One shard (`render_exprs` applied to a slice) written to the temporary file `tmp` (same rows -> same
    bytes); returns its sha256. `io.commit_file` then makes it durable and puts it in place."""
    table = part.to_arrow(compat_level=pl.CompatLevel.newest()).cast(WRITE_SCHEMA)
    with pq.ParquetWriter(
        tmp,
        WRITE_SCHEMA,
        compression=PARQUET_COMPRESSION,
        use_dictionary=DICTIONARY_COLUMNS,
        write_statistics=STATISTICS_COLUMNS,
        store_schema=False,  # FILE_METADATA carries the schema readers restore
    ) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata(FILE_METADATA)
    # Hashed while the file is still in the page cache, in the writer's thread.
    return sha256_file(tmp)


def write_shards(
    rows: pl.DataFrame,
    out_dir: Path,
    cfg: BuildConfig,
    round_: int,
    workers: int | None = None,
    inputs: list[Path] | None = None,
) -> tuple[list[Path], dict[str, str]]:
    """Render, convert, write and hash ``part-NNNNN.parquet`` shard by shard, then remove
    shards of an earlier, larger build.

    Each shard is an independent job (a zero-copy slice of `rows`) run in a
    thread pool: polars and pyarrow release the GIL, so on N cores N shards
    progress at once and no single-threaded step (Arrow conversion, one
    file's write) idles the other cores. Each shard is written to a temporary
    file and handed to one committer thread, which fsyncs and renames it, so
    the writers do not wait on the disk (~15 ms a shard here). The `inputs`
    files are hashed on the same pool after the shards, so a worker left
    without a shard at the end does it. Returns the sha256 of the shards and
    the inputs by path.
    """
    per = cfg.rows_per_shard(rows.height, estimated_bytes(rows, cfg) if cfg.shard_bytes is not None else 0)
    exprs = render_exprs(rows, cfg, round_)
    jobs = [(start, out_dir / f"part-{i:05d}.parquet") for i, start in enumerate(range(0, rows.height, per))]
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1, 8))
    hashes: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=1) as committer:

        def job(item: tuple[int, Path]) -> Future:
            start, path = item
            tmp = temp_path_beside(path)
            try:
                hashes[str(path)] = write_shard(rows.slice(start, per).select(exprs), tmp)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return committer.submit(commit_file, tmp, path)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            commits = [pool.submit(job, item) for item in jobs]
            digests = {str(p): pool.submit(sha256_file, p) for p in inputs or []}
            for commit in commits:
                commit.result().result()
        hashes |= {path: digest.result() for path, digest in digests.items()}
    shards = [path for _, path in jobs]
    names = {p.name for p in shards}
    for old in out_dir.iterdir():
        if SHARD_RE.match(old.name) and old.name not in names:
            old.unlink()
    return shards, hashes


def build(cfg: BuildConfig, out_dir: str | Path, template_files: list[Path] | None = None) -> BuildStats:
    """Build the prompt shards into `out_dir`: part-NNNNN.parquet, stats.json, README.md, manifest.json.

    Everything is written into a fresh folder beside `out_dir` that replaces it in
    one rename at the end (`io.staged_output_dir`): a reader of ``part-*.parquet`` or
    ``load_dataset(out_dir)``, and a build killed at any point, see the old build or
    the new one, never a mix.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    stats = BuildStats(mode=cfg.mode, seed=cfg.seed)
    hint_stats = BuildStats()
    # The (small) hints set loads while the base set is read; the input files
    # are hashed (for the manifest) by write_shards' workers once the shards are out.
    with ThreadPoolExecutor(max_workers=1) as loader:
        hints_job = loader.submit(load_hints, cfg.hints, cfg, hint_stats)
        base = load_base(cfg.base, cfg.mapping, cfg.domain)
        hint_files = resolve_inputs(cfg.hints) if cfg.hints else []
        inputs = list(base.files) + hint_files + list(template_files or [])
        if cfg.answer_after:
            base.frame = base.frame.with_columns(
                pl.col("label").str.split(cfg.answer_after).list.last().str.strip_chars().alias("label")
            )
        problems = validate_base(base, cfg, stats)
        stats.base_problems = problems.height
        hints = hints_job.result()  # its errors are raised after the base set's
        stats.add_hint_counts(hint_stats)
        if cfg.round is not None:
            round_ = cfg.round
        elif hints.height:
            round_ = int(hints.get_column("hint_round").max()) + 1
        else:
            round_ = 0
        stats.round = round_
        rows = prepare_rows(problems, hints, cfg, round_, stats, where=base.where)
        from mentor.pipeline.faults import fault_point

        with staged_output_dir(out_dir, "build", _owned) as staging:
            shards, hashes = write_shards(rows, staging, cfg, round_, inputs=inputs)
            fault_point("build.after_shards")  # resume tests: killed with shards written, nothing swapped in yet
            stats.shards = len(shards)
            write_json_atomic(stats.as_dict() | {"schema_version": SCHEMA_VERSION}, staging / "stats.json")
            with atomic_path(staging / "README.md") as tmp:
                tmp.write_text(dataset_card([s.name for s in shards], stats, [hashes[str(sh)] for sh in shards]))
            write_manifest(
                staging, shards, "prompts", inputs=inputs, config=cfg,
                extra={"base": base.info, "round": round_, "stats": "stats.json"}, hashes=hashes,
            )
    log.info("built %d prompts (%d hinted) in %d shard(s) at %s", stats.rows, stats.hinted_rows, stats.shards, out_dir)
    return stats


_OWNED_FILES = ("manifest.json", "stats.json", "README.md")


def _owned(name: str) -> bool:
    """What build (re)writes in its folder: every part-*.parquet (a reader would take any), its
    three files, and temporary files of earlier runs; anything else is carried into the new build."""
    return name in _OWNED_FILES or (name.startswith("part-") and name.endswith(".parquet")) or (
        name.startswith(".") and name.endswith(".tmp")
    )


__all__ = ["BUNDLED", "BuildConfig", "BuildStats", "build", "build_prompts", "load_base", "load_hints", "validate_base"]
