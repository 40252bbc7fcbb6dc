"""Standalone `mentor build` and `mentor mine` killed (SIGKILL) while rewriting an existing output in place.

After every kill a reader -- a glob of ``part-*.parquet``, ``datasets.load_dataset(DIR)``,
or simply every file of the folder -- sees exactly the old output or exactly the new
one, and what the killed run left beside the folder is removed by the next run, so
temporary files never accumulate. Kill points are the commit protocol's own steps
(MENTOR_FAULT) and random moments (seeded, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from bad_input_lib import leftovers, snapshot, staged_beside
from mentor.data import bundled

ROLLOUTS = bundled("gsm8k_rollouts.parquet")
KILLS = 10


def _cli(args: list[str], env: dict | None = None, prelude: str = "") -> subprocess.Popen:
    code = prelude + "from mentor.workflows.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=dict(os.environ, **(env or {})),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _run(args: list[str]) -> float:
    """Run to completion; returns the wall time."""
    started = time.monotonic()
    p = _cli(args)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    return time.monotonic() - started


def _kill_run(args: list[str], how: tuple, prelude: str = "") -> int:
    """Run `args` and kill it: ("fault", point, skip) at a commit step, or ("timer", seconds) at a moment."""
    if how[0] == "fault":
        p = _cli(args, {"MENTOR_FAULT": how[1], "MENTOR_FAULT_SKIP": str(how[2])}, prelude)
        p.communicate(timeout=300)
    else:
        p = _cli(args, prelude=prelude)
        time.sleep(how[1])
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=300)
    return p.returncode


def _read(out: Path, cache: Path) -> tuple[dict, pl.DataFrame | None, list | None]:
    """What readers get from the folder: every file's bytes; for a build, the rows of a
    ``part-*.parquet`` glob and of ``datasets.load_dataset(DIR)`` (what OpenRLHF calls)."""
    snap = snapshot(out)
    if not (out / "README.md").exists():
        return snap, None, None
    import datasets

    rows = pl.read_parquet(out / "part-*.parquet")
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(cache))
    return snap, rows, ds["label"]


def _readers_see(out: Path, states: dict[str, tuple], cache: Path) -> str:
    """Which complete output the readers get now ('old' / 'new'); fails on anything else."""
    snap, rows, labels = _read(out, cache)
    match = [name for name, (s, _, _) in states.items() if snap == s]
    assert match, f"a mix: {sorted(snap or {})}"
    _, want_rows, want_labels = states[match[0]]
    if want_rows is not None:
        assert rows.equals(want_rows) and labels == want_labels
    return match[0]


def _plan(seed: int, points: list[tuple], full: float) -> list[tuple]:
    """KILLS kill points: every commit step once, the rest random moments between 40% and 98% of
    `full`, the time a whole run takes here (start-up included, so the later ones land in the work)."""
    rng = random.Random(seed)
    plan = [("fault", *p) for p in points]
    while len(plan) < KILLS:
        plan.append(("timer", round(rng.uniform(0.4 * full, 0.98 * full), 3)))
    rng.shuffle(plan)
    return plan


def _kill_loop(tmp: Path, out: Path, configs: dict[str, list[str]], points: list[tuple], seed: int):
    states, took = {}, []
    for name, args in configs.items():  # what readers get from each complete output
        took.append(_run(args))
        states[name] = _read(out, tmp / "cache")
    assert states["old"][0] != states["new"][0]
    current = _readers_see(out, states, tmp / "cache")
    seen = []
    for how in _plan(seed, points, min(took)):
        target = "new" if current == "old" else "old"
        _kill_run(configs[target], how)
        current = _readers_see(out, states, tmp / "cache")
        seen.append((how, target, current))
        # At most the killed run's own leftovers beside the folder: the next run removes them.
        assert len(staged_beside(out.parent)) <= 1, (how, staged_beside(out.parent))
    _run(configs["new" if current == "old" else "old"])
    assert leftovers(out.parent) == [] and leftovers(out) == []
    return seen


def test_build_rebuilt_in_place_and_killed(tmp_path):
    out = tmp_path / "prompts"
    configs = {
        "old": ["build", "--base", "gsm8k", "--out", str(out), "--shard-rows", "200", "--seed", "1"],
        "new": ["build", "--base", "gsm8k", "--out", str(out), "--shard-rows", "150", "--seed", "2", "--instruction", "math="],
    }
    points = [("build.after_shards", 0), ("build.before_swap", 0), ("build.carried", 0), ("build.swapped", 0)]
    seen = _kill_loop(tmp_path, out, configs, points, seed=17)
    # The four commit steps were hit (a fault kill never completes its build).
    faults = [s for s in seen if s[0][0] == "fault"]
    assert {s[0][1] for s in faults} == {p[0] for p in points}
    for how, target, now in faults:
        assert now == (target if how[1] == "build.swapped" else ("new" if target == "old" else "old")), (how, target, now)


def test_mine_rerun_in_place_and_killed(tmp_path):
    out = tmp_path / "collapsed"
    configs = {
        "old": ["mine", str(ROLLOUTS), "--out", str(out), "--k-failed", "1"],
        "new": ["mine", str(ROLLOUTS), "--out", str(out), "--k-failed", "3"],
    }
    points = [("mine.after_collapsed", 0), ("mine.before_swap", 0), ("mine.carried", 0), ("mine.swapped", 0)]
    seen = _kill_loop(tmp_path, out, configs, points, seed=18)
    assert {s[0][1] for s in seen if s[0][0] == "fault"} == {p[0] for p in points}


FALLBACK = "import mentor.pipeline.outdir as _o; _o._exchange = lambda a, b: False\n"


def test_two_rename_swap_killed_between_renames_is_repaired(tmp_path):
    """Where the kernel cannot swap two folders atomically, the old folder is moved aside first;
    killed right then, the target is missing (no mix) and the next run puts the old build back."""
    out = tmp_path / "prompts"
    old = ["build", "--base", "gsm8k", "--out", str(out), "--shard-rows", "400"]
    new = ["build", "--base", "gsm8k", "--out", str(out), "--shard-rows", "100"]
    _run(old)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    assert _kill_run(new, ("fault", "build.moved_aside", 0), prelude=FALLBACK) == -signal.SIGKILL
    assert not out.exists() and len(staged_beside(tmp_path)) == 2  # the moved-aside old build and the new one
    # A reader of the folder now gets "no such folder", never a mix; the next run repairs and rebuilds.
    p = _cli([*old[:-2], "--shard-rows", "400"], env={"MENTOR_FAULT": "build.after_shards"}, prelude=FALLBACK)
    p.communicate(timeout=300)
    assert snapshot(out) == before  # the old build (with the user's file) is back
    assert len(staged_beside(tmp_path)) == 1  # only the run just killed
    _run(new)
    assert leftovers(tmp_path) == [] and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("point", ["build.carried", "build.before_swap"])
def test_users_files_survive_a_kill_and_come_back(tmp_path, point):
    """Files in the folder that are not the build's own are carried into the new build; a kill mid-way
    leaves them in the staged folder, and the next run moves them back before it cleans up."""
    out = tmp_path / "prompts"
    _run(["build", "--base", "gsm8k", "--out", str(out)])
    (out / "notes.txt").write_text("mine")
    (out / "_done").mkdir()
    _kill_run(["build", "--base", "math500", "--out", str(out)], ("fault", point, 0))
    _run(["build", "--base", "gsm8k", "--out", str(out), "--seed", "5"])
    assert (out / "notes.txt").read_text() == "mine" and (out / "_done").is_dir()
    assert leftovers(tmp_path) == []
