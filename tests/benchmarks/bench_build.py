"""Benchmark `mentor build` on a synthetic base set with hints: wall time, and the floor.

    python tests/benchmarks/bench_build.py [--problems 1000000] [--hint-share 0.1] [--repeat 5] [--dir $TMPDIR/mentor-bench-build]

Generates (once, reused) a synthetic base problem set (schema: problems, one
Parquet file, ~200-character math problems) and a hints set for `hint-share` of
them (schema: hints). Then, each in its own process so neither warms the other's
caches, --repeat rounds of:

- build: `stages.build.build`, the function `mentor build --base BASE --hints
  HINTS --out DIR` runs (read + validate both inputs, render prompts and
  labels, write the shards atomically, sha256 them into manifest.json); timed
  inside the process around that call, so the Python/CLI start-up is not counted;
- floor: what any build must do at least -- read the base set (the columns build
  reads, polars), then write build's shards, read into memory before the clock
  starts, with the same writer (pyarrow, zstd) -- no checks, no rendering.

Prints one JSON line: rows, the best build and floor times of the rounds and
rows/s, build/floor, build's CPU seconds (user+sys, all threads) and the
1-minute load average, since wall times on a shared 2-core machine depend on
what else runs. The floor is reported, not a target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD = r"""
import json, resource, sys, time
from mentor.stages.build import BUILD, BuildConfig
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
base, hints, out = sys.argv[1:4]
cfg = BuildConfig(base=base, hints=[hints])
t, c = time.perf_counter(), cpu()
stats = BUILD({}, cfg, out)
dt, dc = time.perf_counter() - t, cpu() - c
print(json.dumps({"seconds": dt, "cpu": dc, "rows": stats.rows, "hinted": stats.hinted_rows, "shards": stats.shards}))
"""

FLOOR = r"""
import glob, json, sys, time
import polars as pl, pyarrow.parquet as pq
base, src, out = sys.argv[1:4]
tables = [pq.read_table(f) for f in sorted(glob.glob(src + "/part-*.parquet"))]
t = time.perf_counter()
pl.read_parquet(base, columns=["problem_id", "domain", "problem", "label", "data_source"])
for i, table in enumerate(tables):
    pq.write_table(table, f"{out}-{i:05d}.parquet", compression="zstd")
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def generate(folder: Path, problems: int, hint_share: float) -> tuple[Path, Path]:
    import numpy as np
    import polars as pl

    from mentor.pipeline.io import write_parquet_atomic

    folder.mkdir(parents=True, exist_ok=True)
    base, hints = folder / "base.parquet", folder / "hints.parquet"
    tag = folder / "params"
    key = f"{problems}:{hint_share}"
    if base.exists() and hints.exists() and tag.exists() and tag.read_text() == key:
        return base, hints
    rng = np.random.default_rng(0)
    words = np.array("the of add subtract multiply total each per so then how many apples pears cost dollars".split())
    w = rng.choice(words, size=(problems, 30))
    nums = rng.integers(1, 1000, size=(problems, 3))
    text = [f"{' '.join(r[:15])} {a} {' '.join(r[15:])} {b} and {c}?" for r, (a, b, c) in zip(w, nums)]
    ids = [f"p-{i:016x}" for i in range(problems)]
    df = pl.DataFrame(
        {
            "problem_id": ids,
            "domain": ["math"] * problems,
            "problem": text,
            "label": [str(x) for x in nums.sum(axis=1)],
            "data_source": ["synthetic/math"] * problems,
        }
    )
    write_parquet_atomic(df, base, dataset="problems")
    n_h = int(problems * hint_share)
    pick = np.sort(rng.choice(problems, size=n_h, replace=False))
    h = pl.DataFrame(
        {
            "problem_id": [ids[i] for i in pick],
            "round": np.zeros(n_h, dtype=np.int32),
            "hint_id": [f"h-{i:012x}" for i in pick],
            "hint": ["Consider what stays the same when you combine the quantities, then count step by step."] * n_h,
            "keywords": [["combine", "count"]] * n_h,
            "status": ["accepted"] * n_h,
            "retries": np.zeros(n_h, dtype=np.int32),
            "refines": np.zeros(n_h, dtype=np.int32),
            "violations": [[]] * n_h,
            "trace": [[]] * n_h,
            "model": ["bench"] * n_h,
            "prompt_version": ["v1"] * n_h,
            "config_hash": ["bench"] * n_h,
        },
        schema_overrides={"violations": pl.List(pl.String)},
    )
    write_parquet_atomic(h.to_arrow(), hints, dataset="hints")
    tag.write_text(key)
    return base, hints


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=1_000_000)
    ap.add_argument("--hint-share", type=float, default=0.1)
    ap.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "mentor-bench-build"),
                    help="Work folder, reused between runs (default: mentor-bench-build in the system temp dir).")
    ap.add_argument("--repeat", type=int, default=5, help="Rounds of (build, floor); the best time of each counts.")
    args = ap.parse_args()
    folder = Path(args.dir)
    base, hints = generate(folder, args.problems, args.hint_share)
    out = folder / "prompts"
    builds, floors = [], []
    load = os.getloadavg()[0]
    # Interleaved rounds: this VM's speed drifts over minutes, so both sides see the same conditions.
    for _ in range(args.repeat):
        builds.append(run(BUILD, str(base), str(hints), str(out)))
        floors.append(run(FLOOR, str(base), str(out), str(folder / "floor")))
    b = min(x["seconds"] for x in builds)
    f = min(x["seconds"] for x in floors)
    rows = builds[0]["rows"]
    print(
        json.dumps(
            {
                "bench": "build",
                "problems": args.problems,
                "rows": rows,
                "hinted": builds[0]["hinted"],
                "shards": builds[0]["shards"],
                "build_s": round(b, 3),
                "build_s_rounds": [round(x["seconds"], 3) for x in builds],
                "build_rows_per_s": round(rows / b),
                "build_cpu_s": round(min(x["cpu"] for x in builds), 3),
                "floor_s": round(f, 3),
                "build_over_floor": round(b / f, 2),
                "cores": os.cpu_count(),
                "load_avg_1m": round(load, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
