"""A new trainer is one folder with one file: ``trainers/toy/launcher.py`` in a folder on ``MENTOR_PLUGIN_PATH``.

The toy trainer's round answers every prompt row of the round's real GSM8K shards k times through
mentor's reward core (right for the problems it is told it solved, wrong for the rest), so its logs
are mentor's rollout records. It runs through `mentor train <round.yaml>` and as the ``trainer`` of a
`mentor run` workflow round (fake hint backend), whose ingest reads its logs in the format the
launcher declares and whose mine finds exactly the problems it got wrong. Each runs in its own
``mentor`` process, as a user would run it: the plugin path is read when mentor starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
import yaml
from toy_plugins import mentor, write_plugins

from mentor.data import bundled



@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict:
    """The plugin folder (its one file), 16 real GSM8K problems (the first 10 by id are solved), and the env."""
    d = tmp_path_factory.mktemp("ext")
    write_plugins(d / "plugins", "trainer")
    frame = pl.read_parquet(bundled("gsm8k_problems.parquet")).sort("problem_id").head(16)
    frame.write_parquet(d / "problems.parquet")
    env = os.environ | {"MENTOR_PLUGIN_PATH": str(d / "plugins")}
    env.pop("MENTOR_ROLLOUT_DIR", None)
    return {"dir": d, "ids": frame["problem_id"].to_list(), "env": env}


def _logged(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_mentor_train_runs_a_toy_trainers_round(plugin, tmp_path):
    d, ids = plugin["dir"], plugin["ids"]
    rd = tmp_path / "run" / "round-000"
    built = mentor(plugin["env"], "build", "--base", str(d / "problems.parquet"), "--out", str(rd / "prompts"))
    assert built.returncode == 0, built.stderr
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"kind": "toy", "round_dir": str(rd), "k": 3, "solved": ids[:10]}))
    res = mentor(plugin["env"], "train", "--config", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    outcome = json.loads((rd / "train" / "outcome.json").read_text())
    assert outcome["ok"] and outcome["final_model"] == str(rd / "train" / "model")
    records = _logged(rd / "rollouts" / "log")
    assert len(records) == 16 * 3 and {r["trainer"] for r in records} == {"toy"}
    assert {r["problem_id"] for r in records if r["correct"] == 1.0} == set(ids[:10])


def test_a_workflow_round_trains_with_the_toy_trainer(plugin, tmp_path):
    d, ids = plugin["dir"], plugin["ids"]
    wf = {"name": "toy", "domain": "math", "base": str(d / "problems.parquet"), "rounds": 1,
          "trainer": {"kind": "toy", "config": {"k": 4, "solved": ids[:10]}}, "mine": {"k_failed": 2},
          "hint": {"backend": {"backend": "fake"}, "config": {"judge_check": {"enabled": False}}}}
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    run_dir = tmp_path / "run"
    res = mentor(plugin["env"], "run", str(path), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout + res.stderr
    train = run_dir / "round-000" / "train"
    assert json.loads((train / "outcome.json").read_text())["ok"]
    assert len(_logged(train / "logs")) == 16 * 4
    collapsed = pl.read_parquet(run_dir / "round-000" / "collapsed" / "collapsed.parquet")
    assert sorted(collapsed["problem_id"].to_list()) == sorted(ids[10:])  # exactly the problems it answered wrong
    assert list((run_dir / "round-000" / "prompts").glob("part-*.parquet"))  # the round went on to build
    # Without the plugin folder the same workflow is refused, naming the kinds there are.
    env = {k: v for k, v in plugin["env"].items() if k != "MENTOR_PLUGIN_PATH"}
    refused = mentor(env, "run", str(path), "--run-dir", str(tmp_path / "other"))
    assert refused.returncode == 2 and "'toy'" in refused.stdout + refused.stderr
