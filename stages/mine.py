"""Mine: find collapsed problems (every rollout's raw correctness is 0).

Mining is a two-phase map/reduce over the rollout shards. Both phases stream
(no shard is held whole as Python objects, and the output is written row group
by row group), and the single-process path and the dask.distributed path run
exactly the same functions:

1. ``count_shard``: one streaming group-by per problem over the small columns
   (problem_id, round, sample_idx, correct): rollouts, valid rollouts, max/min
   correctness over valid rows, quarantine counts, and a 64-bit mask of the
   valid sample indices (its popcount is the number of distinct rollouts, so
   duplicates are found without a per-group hash set). The group key is a
   64-bit hash of problem_id, checked by a second independent hash (a
   collision is detected, and the counts are redone with fresh seeds).
   ``reduce_counts`` merges the parts and decides collapsed / all-correct /
   mixed; the rare groups the mask cannot describe (several rounds, a
   sample_idx outside [0, 64)) get an exact distinct count.
2. ``failed_shard``: per shard, for the collapsed problems only, the failed
   responses, reduced to the first ``k_failed`` distinct ones in (round desc,
   sample_idx, text hash) order and cut to the budget. The driver merges them
   the same way and writes a problem as soon as all its valid rollouts have
   been seen (phase 1 counted them), so memory holds only the problems still
   open, not the whole output. Because the order is defined by content, not
   by file order, the rows do not depend on how rollouts are split into shards;
   the row order of ``collapsed.parquet`` is by the shard where each problem's
   last rollout lies, then by problem_id.

The collapse test uses raw correctness (``correct``), never a shaped reward.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import check_dataset_files, read_parquet_schema, resolve_inputs

log = logging.getLogger(__name__)


class MineConfig(BaseModel):
    """Settings of `mentor mine` (also the `mine:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    correct_col: str = Field("correct", description="Column holding raw correctness in [0, 1]. Never a shaped reward.")
    threshold: float = Field(0.0, ge=0.0, lt=1.0, description="A rollout counts as failed when correctness <= threshold.")
    min_rollouts: int = Field(2, ge=1, le=2**31 - 1, description="Problems with fewer valid rollouts are not judged.")
    k_failed: int = Field(2, ge=0, le=10_000, description="Failed responses kept per collapsed problem (deduplicated).")
    failed_budget_chars: int = Field(
        2000, ge=64, le=2**31 - 1, description="Each kept failed response is cut to this many characters, keeping mostly its end."
    )

    @field_validator("correct_col")
    @classmethod
    def _not_reward(cls, v: str) -> str:
        if v == "reward":
            raise ValueError("'reward' may be shaped; mine on raw correctness (e.g. 'correct' or 'acc')")
        return v


@dataclass
class MineStats:
    rollouts: int = 0
    problems: int = 0
    collapsed: int = 0
    all_correct: int = 0
    mixed: int = 0
    too_few_rollouts: int = 0
    quarantined: Counter = field(default_factory=Counter)
    shards: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "problems": self.problems,
            "collapsed": self.collapsed,
            "all_correct": self.all_correct,
            "mixed": self.mixed,
            "too_few_rollouts": self.too_few_rollouts,
            "collapse_rate": round(self.collapsed / self.problems, 6) if self.problems else 0.0,
            "quarantined": {k: self.quarantined.get(k, 0) for k in QUARANTINE_REASONS},
            "quarantined_total": sum(self.quarantined.values()),
            "shards": self.shards,
        }


QUARANTINE_REASONS = (
    "problem_id_missing", "round_invalid", "sample_idx_invalid", "correct_missing", "correct_out_of_range", "duplicate_key",
)
ROWS_PER_COUNT_PASS = 8_000_000  # one counting pass per this many rollouts: ~0.6 GiB of group-by state
_MASK_BITS = 64  # sample indices [0, 64) of one round are counted by the mask
_SEEDS = ((0x6D656E74, 0x6F72), (0x636F6C6C, 0x61707365), (0x68696E74, 0x73), (0x62756964, 0x6C64))
_KEY = pl.col("round").cast(pl.Int64) * (1 << 32) + pl.col("sample_idx").cast(pl.Int64)


def _key(attempt: int) -> pl.Expr:
    """The group key of phase 1: a 64-bit hash of problem_id (seeds change when a collision was found)."""
    return pl.col("problem_id").hash(_SEEDS[attempt][0])


def _check(attempt: int) -> pl.Expr:
    """A second, independent hash: two problem_ids under one key show as min != max of it."""
    return pl.col("problem_id").hash(_SEEDS[attempt][1])


class _Collision(Exception):
    pass


# --------------------------------------------------------------------------- phase 1


def _scan(path: str | list[str], correct_col: str) -> pl.LazyFrame:
    lf = pl.scan_parquet(path)
    if correct_col != "correct":
        lf = lf.drop("correct", strict=False).rename({correct_col: "correct"})
    return lf


_INT32_MAX = 2**31 - 1
# A row's key: a problem id (not null, not empty) and round / sample_idx in [0, 2^31).
_PID_OK = pl.col("problem_id").is_not_null() & (pl.col("problem_id").str.len_bytes() > 0)
_ROUND_OK = pl.col("round").is_not_null() & (pl.col("round") >= 0) & (pl.col("round") <= _INT32_MAX)
_IDX_OK = pl.col("sample_idx").is_not_null() & (pl.col("sample_idx") >= 0) & (pl.col("sample_idx") <= _INT32_MAX)
_KEY_OK = _PID_OK & _ROUND_OK & _IDX_OK


def _flags() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(correctness, missing, valid); rows with an unusable key are neither missing nor valid."""
    c = pl.col("correct").cast(pl.Float64)
    no_value = c.is_null() | c.is_nan()
    missing = _KEY_OK & no_value
    valid = _KEY_OK & ~no_value & (c >= 0) & (c <= 1)
    return c, missing, valid


def count_shard(path: str | list[str], cfg: MineConfig, attempt: int = 0, part: tuple[int, int] = (0, 1)) -> pl.DataFrame:
    """Per-problem counts of one shard or a list of them (only problem_id, round, sample_idx, correct are read).

    With ``part=(p, P)`` only the problems whose key is p modulo P are counted
    (P passes over the key columns, each holding 1/P of the groups).
    """
    c, missing, valid = _flags()
    si = pl.col("sample_idx")
    in_mask = valid & (si >= 0) & (si < _MASK_BITS)
    bit = pl.lit(2, pl.UInt64).pow(si.clip(0, _MASK_BITS - 1).cast(pl.UInt32))
    check = _check(attempt)
    # when/then (not .filter) keeps every aggregation on polars' streaming engine.
    lf = _scan(path, cfg.correct_col).select("problem_id", "round", "sample_idx", "correct").with_columns(_k=_key(attempt))
    if part[1] > 1:
        lf = lf.filter(pl.col("_k") % part[1] == part[0])
    return (
        lf.group_by("_k")
        .agg(
            n=pl.len(),
            n_valid=valid.sum(),
            n_missing=missing.sum(),
            max_c=pl.when(valid).then(c).max(),
            min_c=pl.when(valid).then(c).min(),
            round=pl.when(valid).then(pl.col("round")).max(),
            round_min=pl.when(valid).then(pl.col("round")).min(),
            mask=pl.when(in_mask).then(bit).bitwise_or(),
            n_outside=(valid & ~in_mask).sum(),
            n_no_pid=(~_PID_OK).sum(),
            n_bad_round=(_PID_OK & ~_ROUND_OK).sum(),
            n_bad_idx=(_PID_OK & _ROUND_OK & ~_IDX_OK).sum(),
            check_min=check.min(),
            check_max=check.max(),
        )
        .collect(engine="streaming")
    )


def _exact_unique(files: list[str], keys: pl.DataFrame, cfg: MineConfig, attempt: int) -> pl.DataFrame:
    """Distinct valid (round, sample_idx) per problem, for the groups the mask cannot count."""
    _, _, valid = _flags()
    return (
        _scan(files, cfg.correct_col)
        .select("problem_id", "round", "sample_idx", "correct")
        .filter(valid)
        .with_columns(_k=_key(attempt))
        .join(keys.lazy(), on="_k", how="semi")
        .group_by("_k")
        .agg(_exact=_KEY.n_unique())
        .collect(engine="streaming")
    )


def reduce_counts(parts: Sequence[pl.DataFrame], cfg: MineConfig, stats: MineStats, files: list[str] | None = None,
                  attempt: int = 0) -> pl.DataFrame:
    """Merge per-shard counts (adding to `stats`); returns one row per problem (key `_k`) with its `kind` and `n_unique`.

    Raises `_Collision` when two problem_ids share a key (the caller redoes the counts with other seeds).
    """
    if len(parts) == 1:  # already one row per problem
        merged = parts[0]
    else:
        merged = pl.concat(parts, how="vertical").group_by("_k").agg(
            pl.col("n", "n_valid", "n_missing", "n_outside", "n_no_pid", "n_bad_round", "n_bad_idx").sum(),
            pl.col("max_c", "round", "check_max").max(),
            pl.col("min_c", "round_min", "check_min").min(),
            pl.col("mask").bitwise_or(),
        )
    if merged.select((pl.col("check_min") != pl.col("check_max")).any()).item():
        raise _Collision
    # Rows without a problem id all hash to one group (a null or empty id): counted, never a problem.
    no_pid = merged.filter(pl.col("n_no_pid") == pl.col("n"))
    if no_pid.height:
        stats.quarantined["problem_id_missing"] += int(no_pid.get_column("n").sum())
        merged = merged.filter(pl.col("n_no_pid") != pl.col("n"))
    simple = (pl.col("n_outside") == 0) & (pl.col("round") == pl.col("round_min"))
    merged = merged.with_columns(n_unique=pl.col("mask").fill_null(0).bitwise_count_ones().cast(pl.UInt32))
    hard = merged.filter(~simple.fill_null(True) & (pl.col("n_valid") > 0)).select("_k")
    if hard.height:
        if files is None:
            raise ValueError("reduce_counts needs the files to count groups spanning rounds or sample_idx >= 64")
        exact = _exact_unique(files, hard, cfg, attempt)
        merged = (
            merged.join(exact, on="_k", how="left")
            .with_columns(n_unique=pl.coalesce("_exact", "n_unique").cast(pl.UInt32))
            .drop("_exact")
        )
    merged = merged.with_columns(n_dup=pl.col("n_valid") - pl.col("n_unique"))
    kind = (
        pl.when(pl.col("n_unique") < cfg.min_rollouts)
        .then(pl.lit("too_few"))
        .when(pl.col("max_c") <= cfg.threshold)
        .then(pl.lit("collapsed"))
        .when(pl.col("min_c") >= 1.0)
        .then(pl.lit("all_correct"))
        .otherwise(pl.lit("mixed"))
    )
    merged = merged.with_columns(kind=kind)
    totals = merged.select(
        pl.col("n_missing").sum(),
        (pl.col("n") - pl.col("n_valid") - pl.col("n_missing") - pl.col("n_bad_round") - pl.col("n_bad_idx")).sum(),
        pl.col("n_dup").sum(),
        pl.col("n_unique").sum(),
        pl.col("n_bad_round").sum(),
        pl.col("n_bad_idx").sum(),
    ).row(0)
    stats.quarantined["correct_missing"] += int(totals[0] or 0)
    stats.quarantined["correct_out_of_range"] += int(totals[1] or 0)
    stats.quarantined["duplicate_key"] += int(totals[2] or 0)
    stats.rollouts += int(totals[3] or 0)
    for reason, n in (("round_invalid", totals[4]), ("sample_idx_invalid", totals[5])):
        if n:
            stats.quarantined[reason] += int(n)
    counts = dict(merged.group_by("kind").len().iter_rows())
    stats.problems += merged.height
    stats.collapsed += counts.get("collapsed", 0)
    stats.all_correct += counts.get("all_correct", 0)
    stats.mixed += counts.get("mixed", 0)
    stats.too_few_rollouts += counts.get("too_few", 0)
    return merged


# --------------------------------------------------------------------------- phase 2


def truncate_keep_end_expr(text: pl.Expr, budget: int) -> pl.Expr:
    """Cut `text` to about `budget` chars: a short head for the approach, mostly the tail for the answer."""
    head = budget // 5
    tail = budget - head
    cut = pl.concat_str(
        [text.str.slice(0, head).str.strip_chars_end(), pl.lit(" [...] "), text.str.slice(-tail).str.strip_chars_start()]
    )
    return pl.when(text.str.len_chars() <= budget).then(text).otherwise(cut)


def truncate_keep_end(text: str, budget: int) -> str:
    """`truncate_keep_end_expr` on one string."""
    return pl.select(truncate_keep_end_expr(pl.lit(text, dtype=pl.String), budget)).item()


# Phase 2 groups by the key `_k`: phase 1 checked that it is one-to-one with problem_id in these files.
_ORDER = ["_k", "round", "sample_idx", "h"]
_DESC = [False, True, False, False]


def failed_shard(path: str, collapsed: pl.DataFrame, cfg: MineConfig, attempt: int = 0) -> dict[str, pl.DataFrame]:
    """What one shard holds of the collapsed problems (`collapsed`: their keys `_k`).

    Returns ``seen`` (per problem: valid rollouts in this shard, and its id,
    text and domain from the first row in (round desc, sample_idx, hash)
    order), ``labels`` (the first non-null label in that order) and ``picks``
    (the first ``k_failed`` distinct non-empty responses in that order, cut to
    the budget). Selection runs on small key columns; only the kept rows' text
    is gathered.
    """
    lf = _scan(path, cfg.correct_col)
    names = set(lf.collect_schema().names())
    _, _, valid = _flags()
    problem = pl.col("problem") if "problem" in names else pl.lit(None, dtype=pl.String)
    stripped = pl.col("response").str.strip_chars()
    rows = (
        lf.filter(valid & (pl.col("correct").cast(pl.Float64) <= cfg.threshold))
        .with_columns(_k=_key(attempt))
        .join(collapsed.lazy(), on="_k", how="semi")
        .select(
            "_k",
            "round",
            "sample_idx",
            "problem_id",
            "domain",
            "label",
            problem.fill_null(pl.col("prompt")).alias("problem"),
            "response",
            h=stripped.hash(seed=0),
            empty=stripped.str.len_bytes() == 0,
        )
        .collect(engine="streaming")
        .with_row_index("_i")
    )
    keys = _sort(rows.select("_i", *_ORDER, "empty", has_label=pl.col("label").is_not_null()), _ORDER, _DESC, "_i")
    starts = keys.with_columns(_pos=pl.int_range(pl.len(), dtype=pl.UInt32)).filter(_run_starts("_k"))
    first = starts.with_columns(m=pl.col("_pos").shift(-1, fill_value=keys.height) - pl.col("_pos")).drop(
        "_pos", "empty", "has_label"
    )
    labelled = keys.filter("has_label").filter(_run_starts("_k")).select("_i", *_ORDER)
    picked = _first_k_distinct(keys.filter(~pl.col("empty")), cfg.k_failed, tie="_i").select("_i", *_ORDER)

    def take(frame: pl.DataFrame, *cols: str) -> pl.DataFrame:  # `frame`'s rows with their text, by row number
        return frame.drop("_i").with_columns(rows.select(pl.col(*cols).gather(frame["_i"])))

    seen = take(first, "problem_id", "domain", "problem")
    labels = take(labelled, "label")
    picks = take(picked, "response").with_columns(truncate_keep_end_expr(pl.col("response"), cfg.failed_budget_chars))
    return {"seen": seen, "labels": labels, "picks": picks}


def _run_starts(*cols: str) -> pl.Expr:
    """True on the first row of each run of equal `cols` (rows sorted by them)."""
    return pl.any_horizontal(*[pl.col(c) != pl.col(c).shift(1) for c in cols]).fill_null(True)


def _first_k_distinct(rows: pl.DataFrame, k: int, tie: str | None = None) -> pl.DataFrame:
    """Per problem, the first k distinct responses (by hash `h`), newest round first, then sample_idx.

    Two sorts and run-boundary filters instead of hash-based unique/group-by:
    sorted by (problem, text), the first row of each run is that text's
    earliest rollout; sorted back into rollout order, a row is among its
    problem's first k when the row k above belongs to another problem.
    Rows equal on every key are ordered by `tie` (else kept in input order).
    """
    by_text = _sort(rows, ["_k", "h", "round", "sample_idx"], [False, False, True, False], tie)
    distinct = _sort(by_text.filter(_run_starts("_k", "h")), _ORDER, _DESC, tie)
    return distinct.filter((pl.col("_k") != pl.col("_k").shift(k)).fill_null(True)) if k else distinct.clear()


def _first(rows: pl.DataFrame, tie: str | None = None) -> pl.DataFrame:
    """Per problem, its first row in rollout order."""
    return _sort(rows, _ORDER, _DESC, tie).filter(_run_starts("_k"))


def _sort(rows: pl.DataFrame, by: list[str], desc: list[bool], tie: str | None) -> pl.DataFrame:
    if tie is None:  # a stable sort keeps input order among equal keys
        return rows.sort(by, descending=desc, maintain_order=True)
    return rows.sort([*by, tie], descending=[*desc, False])


class _Assembler:
    """Merges shard results in shard order and releases each problem once all its valid rollouts were seen."""

    def __init__(self, collapsed: pl.DataFrame, cfg: MineConfig, where: str = "rollouts"):
        self.where = where
        # collapsed: every valid rollout failed, so a problem is complete once n_valid of them were seen
        self.need = collapsed.select("_k", "round", "n_rollouts", "n_valid")
        self.cfg = cfg
        self.open: dict[str, pl.DataFrame] = {}
        self.released = 0

    def add(self, part: dict[str, pl.DataFrame]) -> pl.DataFrame | None:
        """Take one shard's result; return the rows of the problems it completes (or None)."""
        merged = bool(self.open)  # else `part` alone already holds one reduced entry per problem
        frames = {name: pl.concat([self.open[name], f], how="vertical") if merged else f for name, f in part.items()}
        seen = frames["seen"]
        if merged:
            seen = seen.group_by("_k").agg(pl.col("m").sum())
        done = seen.select("_k", "m").join(self.need, on="_k").filter(pl.col("m") >= pl.col("n_valid")).drop("m")
        if done.height == seen.height:  # the usual case: no problem continues in a later shard
            self.open = {}
        else:
            self.open = {name: f.join(done, on="_k", how="anti") for name, f in frames.items()}
            frames = {name: f.join(done, on="_k", how="semi") for name, f in frames.items()}
        if not done.height:
            return None
        self.released += done.height
        if merged:
            frames = {"seen": _first(frames["seen"]), "labels": _first(frames["labels"]),
                      "picks": _first_k_distinct(frames["picks"], self.cfg.k_failed)}
        return self._rows(frames, done)

    def _rows(self, frames: dict[str, pl.DataFrame], done: pl.DataFrame) -> pl.DataFrame:
        info = frames["seen"].select("_k", "problem_id", "problem", "domain")
        for col, fix in (("problem", "re-ingest the logs with --problems (or give the rollouts a prompt)"),
                         ("domain", "set the domain column (math or code), e.g. re-ingest with --domain")):
            bad = info.filter(pl.col(col).is_null())
            if bad.height:
                ids = bad.get_column("problem_id").head(3).to_list()
                raise DataError(f"{self.where}: collapsed problem(s) {ids} have no {col} text in any rollout; {fix}")
        label = frames["labels"].select("_k", "label")
        failed = frames["picks"].group_by("_k", maintain_order=True).agg(pl.col("response").alias("failed"))
        return (
            done.select("_k", "round", "n_rollouts")
            .join(info, on="_k", how="left")
            .join(label, on="_k", how="left")
            .join(failed, on="_k", how="left")
            .drop("_k")
            .with_columns(
                pl.col("failed").fill_null(pl.lit([], dtype=pl.List(pl.String))),
                pl.col("round").cast(pl.Int32),
                pl.col("n_rollouts").cast(pl.Int32),
            )
            .sort("problem_id")
        )


# --------------------------------------------------------------------------- history


def history_frames(paths: Sequence[str]) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """Split `--history` inputs into earlier collapsed sets and earlier hints (by their columns)."""
    collapsed, hints = [], []
    for p in resolve_inputs(paths):
        names = set(read_parquet_schema(p).names)
        if {"hint", "hint_id", "status"} <= names:
            hints.append(pl.read_parquet(p, columns=["problem_id", "round", "hint"]))
        elif {"n_rollouts", "failed", "streak"} <= names:
            collapsed.append(pl.read_parquet(p, columns=["problem_id", "round", "streak"]))
        else:
            raise DataError(f"{p}: --history takes earlier collapsed.parquet or hints.parquet files; found columns {sorted(names)[:10]}")
    c = pl.concat(collapsed).with_columns(pl.col("round").cast(pl.Int32), pl.col("streak").cast(pl.Int32)) if collapsed else None
    h = pl.concat(hints).with_columns(pl.col("round").cast(pl.Int32)) if hints else None
    return c, h


def apply_history(df: pl.DataFrame, history: tuple[pl.DataFrame | None, pl.DataFrame | None]) -> pl.DataFrame:
    """Fill `streak` (consecutive rounds collapsed, this one included) and `previous_hints`.

    `history` is what `history_frames` read from the `--history` files.
    """
    df = df.with_columns(streak=pl.lit(1, pl.Int32), previous_hints=pl.lit([], dtype=pl.List(pl.String)))
    prev_c, prev_h = history
    if prev_c is not None:
        # The streak continues only from the round right before this one.
        prev = prev_c.select("problem_id", (pl.col("round") + 1).alias("round"), pl.col("streak").alias("_prev"))
        df = (
            df.join(prev, on=["problem_id", "round"], how="left")
            .with_columns(streak=(pl.col("_prev").fill_null(0) + 1).cast(pl.Int32))
            .drop("_prev")
        )
    if prev_h is not None:
        hints = (
            df.select("problem_id", pl.col("round").alias("_now"))
            .join(prev_h, on="problem_id")
            .filter(pl.col("round") < pl.col("_now"))
            .sort("problem_id", "round")
            .group_by("problem_id", maintain_order=True)
            .agg(pl.col("hint").alias("_hints"))
        )
        df = (
            df.join(hints, on="problem_id", how="left")
            .with_columns(previous_hints=pl.col("_hints").fill_null(pl.lit([], dtype=pl.List(pl.String))))
            .drop("_hints")
        )
    return df


# --------------------------------------------------------------------------- driver

def serial_map(fn: Callable, items: list, *args) -> list:
    return [fn(item, *args) for item in items]


@dataclass
class Mined:
    """The counts of a mining run, and its collapsed rows as a stream of sorted chunks."""

    stats: MineStats
    chunks: Iterator[pl.DataFrame]


def mine_iter(
    sources: Sequence[str],
    cfg: MineConfig,
    history: Sequence[str] = (),
    map_fn: Callable[..., list] = serial_map,
    batch: int | None = None,
) -> Mined:
    """Count (phase 1) now; return the stats and an iterator over the collapsed rows (schema: collapsed).

    `map_fn(fn, items, *args)` runs `fn(item, *args)` for every shard; the
    default runs them here, `mentor.pipeline.cluster.dask_map` on a cluster.
    On a cluster phase 2 maps `batch` shards at a time (8); in one process the
    next shard is mined in a thread. The rows and their order depend on neither.
    """
    paths = resolve_inputs(sources)
    check_dataset_files(paths, "rollouts")
    if cfg.correct_col != "correct":
        for p in paths:
            schema = read_parquet_schema(p)
            if cfg.correct_col not in schema.names:
                raise ConfigError(f"{p}: column {cfg.correct_col!r} (--correct-col) missing; found {schema.names}")
            found = schema.field(cfg.correct_col).type
            if not (pa.types.is_integer(found) or pa.types.is_floating(found) or pa.types.is_boolean(found)):
                textual = pa.types.is_string(found) or pa.types.is_large_string(found) or pa.types.is_string_view(found)
                raise DataError(
                    f"{p}: column {cfg.correct_col!r} (--correct-col) has type {'string' if textual else found}; "
                    "correctness must be a number "
                    "in [0, 1] (or a bool): pass a numeric column, or re-ingest with --map correct=<column>"
                )
    files = [str(p) for p in paths]
    for attempt in range(len(_SEEDS)):
        try:
            stats, collapsed = _count(files, cfg, map_fn, attempt)
            break
        except _Collision:
            log.warning("problem_id hash collision (seeds %d); counting again with other seeds", attempt)
    else:  # pragma: no cover - four independent 128-bit collisions
        raise DataError(f"{files[0]}: problem_id hashes collide under every seed; report this input")
    batch = batch or 8
    log.info("counted %d problems, %d collapsed", stats.problems, stats.collapsed)
    return Mined(stats, _chunks(files, collapsed, cfg, history_frames(history) if history else (None, None), map_fn, batch, attempt))


def _count(files: list[str], cfg: MineConfig, map_fn: Callable[..., list], attempt: int) -> tuple[MineStats, pl.DataFrame]:
    """Phase 1: the stats, and the collapsed problems' keys, round, valid and distinct rollouts.

    In one process the counts are streaming queries over every file (polars
    parallelises them), one per 1/P of the problems so that the group-by state
    stays bounded; on a cluster each shard is a task. Both go through the same reduce.
    """
    stats = MineStats(shards=len(files))
    if map_fn is serial_map:
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        n_parts = max(1, -(-rows // ROWS_PER_COUNT_PASS))
        groups = ([count_shard(files, cfg, attempt, (p, n_parts))] for p in range(n_parts))  # one at a time
    else:
        groups = iter([map_fn(count_shard, files, cfg, attempt)])
    collapsed = []
    for parts in groups:
        merged = reduce_counts(parts, cfg, stats, files, attempt)
        collapsed.append(
            merged.filter(pl.col("kind") == "collapsed").select("_k", "round", "n_valid", pl.col("n_unique").alias("n_rollouts"))
        )
        del parts, merged
    return stats, pl.concat(collapsed)


def _chunks(files, collapsed, cfg, history, map_fn, batch, attempt) -> Iterator[pl.DataFrame]:
    if not collapsed.height:
        return
    assembler = _Assembler(collapsed, cfg, files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more)")
    keys = collapsed.select("_k")  # all a shard needs to find its collapsed rows
    if map_fn is serial_map:  # in-process: the next shard is mined in a thread while this one is assembled
        parts: Iterator[dict] = _threaded(failed_shard, files, keys, cfg, attempt)
    else:
        parts = (part for i in range(0, len(files), batch)
                 for part in map_fn(failed_shard, files[i : i + batch], keys, cfg, attempt))
    for part in parts:
        rows = assembler.add(part)
        if rows is not None:
            yield apply_history(rows, history)
    if assembler.released != collapsed.height:
        raise DataError(
            f"{files[0]}: the rollouts changed while mining ({assembler.released} of {collapsed.height} "
            "collapsed problems found again); mine a snapshot that is not being written"
        )


def _threaded(fn: Callable, items: list, *args, workers: int = 1) -> Iterator:
    """`fn(item, *args)` for each item in `workers` threads, results in item order (at most `workers` held).

    Two workers gain nothing on two cores (polars already uses both) and hold one more shard.
    """
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        todo = iter(items)
        for item in itertools.islice(todo, workers):
            pending.append(pool.submit(fn, item, *args))
        while pending:
            result = pending.popleft().result()
            for item in itertools.islice(todo, 1):
                pending.append(pool.submit(fn, item, *args))
            yield result


def mine(
    sources: Sequence[str],
    cfg: MineConfig,
    history: Sequence[str] = (),
    map_fn: Callable[..., list] = serial_map,
) -> tuple[pl.DataFrame, MineStats]:
    """Return the whole collapsed set (schema: collapsed) sorted by problem_id, and the stats."""
    from mentor.pipeline.io import to_table
    from mentor.pipeline.schemas import COLLAPSED

    mined = mine_iter(sources, cfg, history, map_fn)
    parts = [pl.from_arrow(to_table(c, "collapsed")) for c in mined.chunks]
    df = pl.concat(parts) if parts else pl.from_arrow(COLLAPSED.empty_table())
    return df.sort("problem_id"), mined.stats


def mine_to_dir(
    sources: Sequence[str],
    out_dir: str | Path,
    cfg: MineConfig,
    history: Sequence[str] = (),
    map_fn: Callable[..., list] = serial_map,
) -> MineStats:
    """Mine and stream ``collapsed.parquet`` to disk (written atomically), then ``stats.json``."""
    from mentor.pipeline.faults import fault_point
    from mentor.pipeline.io import outside_output, parquet_writer_atomic, write_json_atomic
    from mentor.pipeline.outdir import check_output_dir, staged_output_dir

    check_output_dir(Path(out_dir))
    sources = [str(f) for f in outside_output(resolve_inputs(sources), sources, out_dir)]
    mined = mine_iter(sources, cfg, history, map_fn)
    # Both files are written into a fresh folder swapped in at the end: a kill or an error
    # leaves the old collapsed.parquet and stats.json (a matching pair) or the new ones.
    with staged_output_dir(out_dir, "mine", _owned) as staging:
        # One writer thread: a chunk is compressed and written while the next shards are mined.
        with parquet_writer_atomic(staging / "collapsed.parquet", "collapsed") as write, ThreadPoolExecutor(1) as writer:
            writing = None
            for chunk in mined.chunks:
                if writing is not None:
                    writing.result()
                writing = writer.submit(write, chunk)
            if writing is not None:
                writing.result()
        fault_point("mine.after_collapsed")
        write_json_atomic(mined.stats.as_dict() | {"config": cfg.model_dump()}, staging / "stats.json")
    return mined.stats


def _owned(name: str) -> bool:
    """What mine (re)writes in its folder (and temporary files of earlier runs)."""
    return name in ("collapsed.parquet", "stats.json") or (name.startswith(".") and name.endswith(".tmp"))
