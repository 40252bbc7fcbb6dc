"""Make this fixture: a run directory written by mentor before issue 60's layout change (tests/test_old_run_dir.py).

    git worktree add /tmp/oldtree 8514e4b          # the last commit before issue 60's first merge (8c543e6)
    (a Python that imports mentor from /tmp/oldtree, with the trainers' packages)
    cd tests/data/old_run && PYTHON=... python make_old_run.py
    git worktree remove --force /tmp/oldtree

Writes problems.parquet and initial.parquet (4 real GSM8K problems, 2 of them collapsed in their real rollouts),
wf.yaml (a two-round offline workflow whose policy and hint model are the fakes of wf_fakes.py, every path relative
to this folder), then runs the old code's ``mentor run wf.yaml --run-dir run --rounds 1`` here: round 0 is finished,
round 1 is not. Only ``run/`` and the inputs are kept (no logs outside it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import yaml

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[2] / "data"  # this repository's bundled sets (the same files in the old tree)


def inputs() -> None:
    rollouts = pl.read_parquet(SHARED / "gsm8k_rollouts.parquet")
    best = rollouts.group_by("problem_id").agg(pl.col("correct").max()).sort("problem_id")
    ids = sorted(best.filter(pl.col("correct") == 0)["problem_id"].head(2).to_list()
                 + best.filter(pl.col("correct") > 0)["problem_id"].head(2).to_list())
    pl.read_parquet(SHARED / "gsm8k_problems.parquet").filter(pl.col("problem_id").is_in(ids)).write_parquet(HERE / "problems.parquet")
    rollouts.filter(pl.col("problem_id").is_in(ids)).write_parquet(HERE / "initial.parquet")
    wf = {
        "name": "old-run",
        "domain": "math",
        "base": "problems.parquet",
        "rounds": 2,
        "initial_rollouts": {"source": ["initial.parquet"], "format": "canonical"},
        "trainer": {"kind": "offline", "policy": {"backend": "fake", "options": {"script": "wf_fakes:policy"}}, "rollout": {"k": 2}},
        "mine": {"k_failed": 2},
        "hint": {"backend": {"backend": "fake", "options": {"script": "wf_fakes:hinter"}}, "config": {"shard_size": 1}},
        "build": {},
    }
    (HERE / "wf.yaml").write_text(yaml.safe_dump(wf, sort_keys=False))


def main() -> int:
    python = os.environ.get("PYTHON", sys.executable)
    inputs()
    shutil.rmtree(HERE / "run", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(HERE), HF_HUB_OFFLINE="1")
    cmd = [python, "-m", "mentor.cli", "run", "wf.yaml", "--run-dir", "run", "--rounds", "1"]
    return subprocess.run(cmd, cwd=HERE, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
