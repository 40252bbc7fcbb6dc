"""Mine's history: earlier rounds' collapsed and hints files (``--history``) give each collapsed problem its
``streak`` (consecutive rounds collapsed) and ``previous_hints``."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from mentor.pipeline.errors import DataError
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_parquet_schema


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
