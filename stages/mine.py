"""Mine: find collapsed problems (every rollout's raw correctness is 0).

Mining is a two-phase map/reduce over the rollout shards so that it streams
(no shard is ever held whole as Python objects) and so that the single-process
path and the dask.distributed path run exactly the same functions:

1. ``count_shard``: per shard, one row per problem: rollouts, valid rollouts,
   max/min correctness over valid rows, quarantine counts, and the
   (round, sample_idx) keys (to count duplicates across shards).
   ``reduce_counts`` merges them and decides collapsed / all-correct / mixed.
2. ``failed_shard``: per shard, for the collapsed problems only, the failed
   responses, truncated to the budget and reduced to the first ``k_failed``
   distinct ones in (sample_idx, text) order. ``reduce_failed`` merges them
   the same way. Because the order is defined by content, not by file order,
   the result does not depend on how rows are split into shards.

The collapse test uses raw correctness (``correct``), never a shaped reward.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import check_dataset_files, read_parquet_schema, resolve_inputs

log = logging.getLogger(__name__)


class MineConfig(BaseModel):
    """Settings of `mentor mine` (also the `mine:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    correct_col: str = Field("correct", description="Column holding raw correctness in [0, 1]. Never a shaped reward.")
    threshold: float = Field(0.0, ge=0.0, lt=1.0, description="A rollout counts as failed when correctness <= threshold.")
    min_rollouts: int = Field(2, ge=1, description="Problems with fewer valid rollouts are not judged.")
    k_failed: int = Field(2, ge=0, description="Failed responses kept per collapsed problem (deduplicated).")
    failed_budget_chars: int = Field(
        2000, ge=64, description="Each kept failed response is cut to this many characters, keeping mostly its end."
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


QUARANTINE_REASONS = ("correct_missing", "correct_out_of_range", "duplicate_key")
_KEY = pl.col("round").cast(pl.Int64) * (1 << 32) + pl.col("sample_idx").cast(pl.Int64)


# --------------------------------------------------------------------------- phase 1


def _scan(path: str | list[str], correct_col: str) -> pl.LazyFrame:
    lf = pl.scan_parquet(path)
    if correct_col != "correct":
        lf = lf.drop("correct", strict=False).rename({correct_col: "correct"})
    return lf


def count_shard(path: str | list[str], cfg: MineConfig) -> pl.DataFrame:
    """Per-problem counts of one shard or a list of them (only problem_id, round, sample_idx, correct are read)."""
    c = pl.col("correct").cast(pl.Float64)
    missing = c.is_null() | c.is_nan()
    out_of_range = ~missing & ((c < 0) | (c > 1))
    valid = ~missing & ~out_of_range
    # when/then (not .filter) keeps every aggregation on polars' streaming engine.
    c_valid = pl.when(valid).then(c)
    return (
        _scan(path, cfg.correct_col)
        .select("problem_id", "round", "sample_idx", "correct")
        .group_by("problem_id")
        .agg(
            n=pl.len(),
            n_valid=valid.sum(),
            n_missing=missing.sum(),
            n_range=out_of_range.sum(),
            max_c=c_valid.max(),
            min_c=c_valid.min(),
            round=pl.col("round").max(),
            # Distinct (round, sample_idx) among valid rows: the rest are duplicates.
            n_unique=pl.when(valid).then(_KEY).drop_nulls().n_unique(),
        )
        .collect(engine="streaming")
    )


def reduce_counts(parts: Sequence[pl.DataFrame], cfg: MineConfig, stats: MineStats) -> pl.DataFrame:
    """Merge per-shard counts; returns one row per problem with its `kind`."""
    if len(parts) == 1:  # already one row per problem
        merged = parts[0]
    else:
        merged = pl.concat(parts, how="vertical").group_by("problem_id").agg(
            pl.col("n").sum(),
            pl.col("n_valid").sum(),
            pl.col("n_missing").sum(),
            pl.col("n_range").sum(),
            pl.col("max_c").max(),
            pl.col("min_c").min(),
            pl.col("round").max(),
            pl.col("n_unique").sum(),
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
        pl.col("n_missing").sum(), pl.col("n_range").sum(), pl.col("n_dup").sum(), pl.col("n_unique").sum()
    ).row(0)
    stats.quarantined["correct_missing"] += int(totals[0] or 0)
    stats.quarantined["correct_out_of_range"] += int(totals[1] or 0)
    stats.quarantined["duplicate_key"] += int(totals[2] or 0)
    stats.rollouts = int(totals[3] or 0)
    counts = dict(merged.group_by("kind").len().iter_rows())
    stats.problems = merged.height
    stats.collapsed = counts.get("collapsed", 0)
    stats.all_correct = counts.get("all_correct", 0)
    stats.mixed = counts.get("mixed", 0)
    stats.too_few_rollouts = counts.get("too_few", 0)
    return merged


# --------------------------------------------------------------------------- phase 2


def truncate_keep_end(text: str, budget: int) -> str:
    """Cut `text` to about `budget` chars: a short head for the approach, mostly the tail for the answer."""
    if len(text) <= budget:
        return text
    head = budget // 5
    tail = budget - head
    return text[:head].rstrip() + " [...] " + text[-tail:].lstrip()


def failed_shard(path: str, collapsed_ids: pl.DataFrame, cfg: MineConfig) -> pl.DataFrame:
    """Failed responses of collapsed problems in one shard: the first k distinct per problem.

    Only the rows of collapsed problems that failed are materialised; selection
    runs on small key columns, and text is cut to the budget only for the
    (at most k per problem) rows that are kept.
    """
    lf = _scan(path, cfg.correct_col)
    names = set(lf.collect_schema().names())
    problem = pl.col("problem") if "problem" in names else pl.lit(None, dtype=pl.String)
    rows = (
        lf.filter(pl.col("correct").cast(pl.Float64) <= cfg.threshold)
        .join(collapsed_ids.lazy(), on="problem_id", how="semi")
        .select(
            "problem_id",
            "round",
            "sample_idx",
            "domain",
            "label",
            problem.fill_null(pl.col("prompt")).alias("problem"),
            "response",
            h=pl.col("response").str.strip_chars().hash(seed=0),
        )
        .filter(pl.col("response").str.strip_chars().str.len_bytes() > 0)
        .collect(engine="streaming")
    )
    picked = _first_k_distinct(rows.select("problem_id", "round", "sample_idx", "h").with_row_index("_i"), cfg.k_failed)
    out = rows[picked["_i"]]
    cut = [truncate_keep_end(t, cfg.failed_budget_chars) for t in out.get_column("response")]
    return out.with_columns(pl.Series("response", cut, dtype=pl.String))


def _first_k_distinct(rows: pl.DataFrame, k: int) -> pl.DataFrame:
    """Per problem, the first k distinct responses (by hash `h`), newest round first, then sample_idx."""
    return (
        rows.sort("problem_id", "round", "sample_idx", "h", descending=[False, True, False, False])
        .unique(subset=["problem_id", "h"], keep="first", maintain_order=True)
        .group_by("problem_id", maintain_order=True)
        .head(k)
    )


def reduce_failed(parts: Sequence[pl.DataFrame], cfg: MineConfig) -> pl.DataFrame:
    rows = _first_k_distinct(pl.concat(parts, how="vertical"), cfg.k_failed)
    return rows.group_by("problem_id").agg(
        pl.col("response").alias("failed"),
        pl.col("problem").first(),
        pl.col("domain").first(),
        pl.col("label").drop_nulls().first(),
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


def apply_history(df: pl.DataFrame, history: Sequence[str]) -> pl.DataFrame:
    """Fill `streak` (consecutive rounds collapsed, this one included) and `previous_hints`."""
    df = df.with_columns(streak=pl.lit(1, pl.Int32), previous_hints=pl.lit([], dtype=pl.List(pl.String)))
    if not history:
        return df
    prev_c, prev_h = history_frames(history)
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


def mine(
    sources: Sequence[str],
    cfg: MineConfig,
    history: Sequence[str] = (),
    map_fn: Callable[..., list] = serial_map,
) -> tuple[pl.DataFrame, MineStats]:
    """Return the collapsed set (schema: collapsed) and the mining stats.

    `map_fn(fn, items, *args)` runs `fn(item, *args)` for every shard; the
    default runs them here, `mentor.pipeline.cluster.dask_map` on a cluster.
    """
    paths = resolve_inputs(sources)
    check_dataset_files(paths, "rollouts")
    if cfg.correct_col != "correct":
        for p in paths:
            names = read_parquet_schema(p).names
            if cfg.correct_col not in names:
                raise ConfigError(f"{p}: column {cfg.correct_col!r} (--correct-col) missing; found {names}")
    stats = MineStats(shards=len(paths))
    files = [str(p) for p in paths]
    # In one process the counts are one streaming query over every file (polars
    # parallelises it); on a cluster each shard is a task. Both go through the
    # same reduce. Duplicate keys are found within a unit of work (ingest
    # already drops them across the shards it writes).
    units = [files] if map_fn is serial_map else files
    merged = reduce_counts(map_fn(count_shard, units, cfg), cfg, stats)
    collapsed = merged.filter(pl.col("kind") == "collapsed").select("problem_id", "round", pl.col("n_unique").alias("n_rollouts"))
    ids = collapsed.select("problem_id")
    if cfg.k_failed > 0 and ids.height:
        failed = reduce_failed(map_fn(failed_shard, files, ids, cfg), cfg)
    else:
        failed = _texts_only(files, ids)
    df = collapsed.join(failed, on="problem_id", how="left").with_columns(
        pl.col("failed").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        pl.col("round").cast(pl.Int32),
        pl.col("n_rollouts").cast(pl.Int32),
    )
    df = apply_history(df, history).sort("problem_id")
    log.info("mined %d collapsed of %d problems", stats.collapsed, stats.problems)
    return df, stats


def _texts_only(files: list[str], ids: pl.DataFrame) -> pl.DataFrame:
    """Problem text/domain/label of collapsed problems when no failed responses are kept."""
    lf = pl.scan_parquet(files)
    names = set(lf.collect_schema().names())
    problem = pl.col("problem") if "problem" in names else pl.lit(None, dtype=pl.String)
    return (
        lf.join(ids.lazy(), on="problem_id", how="semi")
        .group_by("problem_id")
        .agg(
            problem.fill_null(pl.col("prompt")).first().alias("problem"),
            pl.col("domain").first(),
            pl.col("label").drop_nulls().first(),
            pl.lit([], dtype=pl.List(pl.String)).first().alias("failed"),
        )
        .collect()
    )


def mine_to_dir(
    sources: Sequence[str],
    out_dir: str | Path,
    cfg: MineConfig,
    history: Sequence[str] = (),
    map_fn: Callable[..., list] = serial_map,
) -> MineStats:
    """Run `mine` and write ``collapsed.parquet`` and ``stats.json`` atomically."""
    from mentor.pipeline.io import write_json_atomic, write_parquet_atomic

    from mentor.pipeline.faults import fault_point

    df, stats = mine(sources, cfg, history, map_fn)
    out_dir = Path(out_dir)
    write_parquet_atomic(df, out_dir / "collapsed.parquet", dataset="collapsed")
    fault_point("mine.after_collapsed")
    write_json_atomic(stats.as_dict() | {"config": cfg.model_dump()}, out_dir / "stats.json")
    return stats
