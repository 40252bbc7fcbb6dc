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
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from mentor.data import bundled

TOY = '''
"""A toy trainer: one round answers each prompt row k times through mentor's reward core."""

import os
import subprocess
import time
from typing import ClassVar

from mentor.training.launcher import LauncherBase, RoundConfig, finish_round, outcome_record

ROUND = """
import glob, json, os, sys
import pyarrow.parquet as pq
from mentor.training.reward_core import score_and_log, target_from_label
sources, solved, k = sys.argv[1].split(","), set(json.loads(sys.argv[2])), int(sys.argv[3])
files = [f for s in sources for f in (sorted(glob.glob(os.path.join(s, "part-*.parquet"))) if os.path.isdir(s) else [s])]
for f in files:
    for row in pq.read_table(f).to_pylist():
        prompt = row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"])
        target = target_from_label(row["label"], prompt)
        answer = target.reference if target.problem_id in solved else "-1"
        for _ in range(k):
            score_and_log(target, "So the answer is \\\\\\\\boxed{" + str(answer) + "}.", prompt, "toy", truncated=False)
"""


class ToyConfig(RoundConfig):
    k: int = 4
    solved: list[str] = []


class ToyLauncher(LauncherBase):
    kind: ClassVar[str] = "toy"
    Config: ClassVar[type[ToyConfig]] = ToyConfig

    def command(self, cfg):
        return [cfg.python, "-c", ROUND, ",".join(cfg.prompt_sources), __import__("json").dumps(cfg.solved), str(cfg.k)]

    def env(self, cfg):
        return {"MENTOR_ROLLOUT_DIR": str(cfg.rollout_dir), "MENTOR_ROUND": str(cfg.round)}

    def run_round(self, cfg):
        cmd, env, started = self.command(cfg), self.env(cfg), time.time()
        cfg.rollout_dir.mkdir(parents=True, exist_ok=True)
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        with open(cfg.log_file, "wb") as fh:
            code = subprocess.run(cmd, env=os.environ | env, stdout=fh, stderr=subprocess.STDOUT).returncode
        outcome = outcome_record(cfg, code, cfg.output_dir if code == 0 else None, cfg.actor_model or "toy", cmd, env, started)
        return finish_round(cfg, outcome, f"the toy trainer exited with code {code}" if code else None)


LAUNCHER = ToyLauncher()
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict:
    """The plugin folder (its one file), 16 real GSM8K problems (the first 10 by id are solved), and the env."""
    d = tmp_path_factory.mktemp("ext")
    (d / "plugins" / "trainers" / "toy").mkdir(parents=True)
    (d / "plugins" / "trainers" / "toy" / "launcher.py").write_text(TOY)
    frame = pl.read_parquet(bundled("gsm8k_problems.parquet")).sort("problem_id").head(16)
    frame.write_parquet(d / "problems.parquet")
    env = os.environ | {"MENTOR_PLUGIN_PATH": str(d / "plugins")}
    env.pop("MENTOR_ROLLOUT_DIR", None)
    return {"dir": d, "ids": frame["problem_id"].to_list(), "env": env}


def _mentor(args: list[str], env: dict) -> subprocess.CompletedProcess:
    code = "import sys; from mentor.workflows.cli import main; sys.argv = ['mentor', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)


def _logged(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_mentor_train_runs_a_toy_trainers_round(plugin, tmp_path):
    d, ids = plugin["dir"], plugin["ids"]
    rd = tmp_path / "run" / "round-000"
    built = _mentor(["build", "--base", str(d / "problems.parquet"), "--out", str(rd / "prompts")], plugin["env"])
    assert built.returncode == 0, built.stderr
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"kind": "toy", "round_dir": str(rd), "k": 3, "solved": ids[:10]}))
    res = _mentor(["train", "--config", str(path)], plugin["env"])
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
    res = _mentor(["run", str(path), "--run-dir", str(run_dir)], plugin["env"])
    assert res.returncode == 0, res.stdout + res.stderr
    train = run_dir / "round-000" / "train"
    assert json.loads((train / "outcome.json").read_text())["ok"]
    assert len(_logged(train / "logs")) == 16 * 4
    collapsed = pl.read_parquet(run_dir / "round-000" / "collapsed" / "collapsed.parquet")
    assert sorted(collapsed["problem_id"].to_list()) == sorted(ids[10:])  # exactly the problems it answered wrong
    assert list((run_dir / "round-000" / "prompts").glob("part-*.parquet"))  # the round went on to build
    # Without the plugin folder the same workflow is refused, naming the kinds there are.
    env = {k: v for k, v in plugin["env"].items() if k != "MENTOR_PLUGIN_PATH"}
    refused = _mentor(["run", str(path), "--run-dir", str(tmp_path / "other")], env)
    assert refused.returncode == 2 and "'toy'" in refused.stdout + refused.stderr
