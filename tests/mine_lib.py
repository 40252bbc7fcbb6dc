"""`mine(sources, cfg)` for tests: the mine stage run the one way (`MINE`, the driver) into a temporary folder,
its collapsed rows read back in memory (sorted by problem_id) with its stats."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from mentor.pipeline.executor import LOCAL, Executor
from mentor.pipeline.stage import Context, Stats
from mentor.stages.mine import MINE, MineConfig


def mine(sources: Sequence[str], cfg: MineConfig, history: Sequence[str] = (),
         executor: Executor = LOCAL) -> tuple[pl.DataFrame, Stats]:
    with tempfile.TemporaryDirectory(prefix="mine-") as d:
        out = Path(d) / "collapsed"
        stats = MINE({"sources": list(sources), "history": list(history)}, cfg, out, Context(executor=executor))
        df = pl.read_parquet(out / "collapsed.parquet")
    return df.sort("problem_id"), stats
