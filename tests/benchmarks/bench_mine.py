"""Benchmark `mentor mine` on a synthetic rollout log: wall time, peak memory, and the floor.

    python tests/benchmarks/bench_mine.py [--rows 20000000] [--shards 20] [--dir $TMPDIR/mentor-bench-mine]

Generates (once, reused) `rows` canonical rollouts in Parquet shards, k=4 rollouts
per problem, ~1/3 collapsed, ~250-byte responses; then, each in its own process
(so peak RSS is its own), runs
- `mentor mine DIR --out ...` (the CLI, as a user runs it), and
- the floor: what any miner that keeps failed responses must do at least -- a
  bare polars group-by for the collapsed ids, reading those problems' failed
  responses, writing an output of mine's size -- with no checks, no quarantine,
  no deduplication, no bounded memory;
and prints one JSON line (mine's wall and CPU seconds, peak RSS; the floor's
parts; the 1-minute load average). The limit that holds is peak RSS <= 1 GiB
(`rss_limit_mib`); wall time is reported against the floor, not held to a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The least any miner that keeps failed responses must do: a bare group-by for the
# collapsed ids, read the failed responses of those problems, and write an output of
# mine's size. Prints the three times and the number of collapsed ids.
FLOOR = r"""
import sys, time, polars as pl, pyarrow.parquet as pq
out, files = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
ids = (pl.scan_parquet(files).group_by("problem_id").agg(pl.col("correct").max(), pl.len())
       .filter((pl.col("correct") <= 0) & (pl.col("len") >= 2)).select("problem_id").collect(engine="streaming"))
t1 = time.perf_counter()
n = (pl.scan_parquet(files).filter(pl.col("correct") <= 0).join(ids.lazy(), on="problem_id", how="semi")
     .select(pl.col("response").str.len_bytes().sum()).collect(engine="streaming").item())
t2 = time.perf_counter()
table = pq.read_table(out)
t3 = time.perf_counter()
pq.write_table(table, out + ".floor", compression="zstd")
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t4 - t3, ids.height)
"""


def generate(out: Path, rows: int, shards: int, k: int = 4) -> list[Path]:
    import numpy as np
    import polars as pl

    from mentor.pipeline.io import write_parquet_atomic

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"part-{i:05d}.parquet" for i in range(shards)]
    if all(p.exists() for p in paths) and (out / "rows").exists() and (out / "rows").read_text() == str(rows):
        return paths
    per = rows // shards
    rng = np.random.default_rng(0)
    words = np.array("the of add subtract multiply total each per so then we get answer left cost".split())
    # ~250-byte responses: 1,000 random 40-word texts, each row picks one and appends its own answer.
    pool = [" ".join(rng.choice(words, size=40)) for _ in range(1000)]
    for s, path in enumerate(paths):
        start = s * per
        idx = np.arange(start, start + per)
        prob = idx // k
        # difficulty per problem: ~1/3 collapsed, ~1/8 all-correct, the rest mixed
        u = (prob * 2654435761 % 1000) / 1000.0
        p_correct = np.where(u < 0.33, 0.0, np.where(u > 0.875, 1.0, 0.5))
        correct = (rng.random(per) < p_correct).astype(np.float64)
        df = pl.DataFrame(
            {
                "pid": prob,
                "round": np.zeros(per, dtype=np.int32),
                "sample_idx": (idx % k).astype(np.int32),
                "tpl": rng.integers(0, len(pool), per),
                "num": rng.integers(0, 10_000, per),
                "correct": correct,
            }
        ).select(
            pl.format("p-{}", pl.col("pid").cast(pl.String).str.zfill(16)).alias("problem_id"),
            "round",
            "sample_idx",
            pl.format("Problem {}: how many apples?", "pid").alias("problem"),
            pl.format("Problem {}: how many apples?", "pid").alias("prompt"),
            pl.format("{} A: {}", pl.lit(pool).list.get(pl.col("tpl")), "num").alias("response"),
            "correct",
            pl.col("correct").alias("reward"),
            pl.lit("math").alias("domain"),
            (pl.col("pid") % 997).cast(pl.String).alias("label"),
            pl.lit("bench").alias("source"),
        )
        write_parquet_atomic(df, path, dataset="rollouts", row_group_size=256_000)
        print(f"generated {path} ({per} rows)", file=sys.stderr)
    (out / "rows").write_text(str(rows))
    return paths


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user+sys, all threads), peak RSS (bytes) of the child, stdout."""
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed: {err[-2000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # max over children so far
    return wall, cpu, rss, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "mentor-bench-mine"),
                    help="Work folder, reused between runs (default: mentor-bench-mine in the system temp dir).")
    args = ap.parse_args()
    base = Path(args.dir)
    paths = generate(base / "rollouts", args.rows, args.shards)
    files = [str(p) for p in paths]
    mentor = [sys.executable, "-m", "mentor.workflows.cli", "mine", str(base / "rollouts"), "--out", str(base / "collapsed")]
    load = os.getloadavg()[0]
    # Mine runs first, so RUSAGE_CHILDREN's max is mine's own peak.
    mine_s, mine_cpu, mine_rss, _ = timed(mentor)
    _, _, _, floor_out = timed([sys.executable, "-c", FLOOR, str(base / "collapsed" / "collapsed.parquet"), *files])
    bare_s, read_s, write_s, collapsed_ids = floor_out.split()
    (base / "collapsed" / "collapsed.parquet.floor").unlink()
    floor_s = float(bare_s) + float(read_s) + float(write_s)
    stats = json.loads((base / "collapsed" / "stats.json").read_text())
    assert stats["collapsed"] == int(collapsed_ids), (stats["collapsed"], collapsed_ids)
    print(
        json.dumps(
            {
                "bench": "mine",
                "rows": args.rows,
                "shards": args.shards,
                "collapsed": stats["collapsed"],
                "mine_s": round(mine_s, 2),
                "mine_rows_per_s": round(args.rows / mine_s),
                "mine_cpu_s": round(mine_cpu, 2),  # user+sys of all its threads: less sensitive to load than wall time
                "mine_peak_rss_mib": round(mine_rss / 2**20, 1),
                "rss_limit_mib": 1024,
                # bare group-by + reading the collapsed problems' failed responses + writing an output of mine's size
                "floor_s": round(floor_s, 2),
                "floor_groupby_s": round(float(bare_s), 2),
                "floor_read_failed_s": round(float(read_s), 2),
                "floor_write_output_s": round(float(write_s), 2),
                "mine_over_floor": round(mine_s / floor_s, 2),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(load, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
