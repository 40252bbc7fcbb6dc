"""A backend is one new file: a toy kind in a MENTOR_PLUGIN_PATH folder (``backends/toy.py``), nothing else edited,
is a `--backend` choice of every command (and in their --help), hints with `mentor hint`, is a workflow's hint model
and offline policy in a `mentor run` of two rounds on real GSM8K problems, and is what `mentor doctor` checks."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from toy_plugins import BACKEND_HINT, write_plugins

from mentor.workflows.cli import cli
from mentor.data import bundled
from mentor.pipeline import plugins



@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """The plugin folder: one file, backends/toy.py."""
    folder = write_plugins(tmp_path / "plugins", "backend")
    monkeypatch.setenv(plugins.PLUGIN_PATH_ENV, str(folder))
    return folder


def test_the_toy_is_a_choice_of_every_backend_flag(toy):
    for command in (["hint"], ["rollout"], ["rescue"], ["check-judge"], ["doctor"]):
        r = CliRunner().invoke(cli, [*command, "--help"])
        assert r.exit_code == 0, r.output
        assert "toy" in r.output.split("--backend", 1)[1].split("\n  --", 1)[0], (command, r.output)
    r = CliRunner().invoke(cli, ["hint", "--help"])
    assert "answers every request by one canned rule" in " ".join(r.output.split())  # the kind's own help


def test_mentor_hint_with_the_toy(toy, gsm8k_collapsed, tmp_path):
    out = tmp_path / "h"
    r = CliRunner().invoke(cli, ["hint", str(gsm8k_collapsed), "--out", str(out), "--backend", "toy", "--sample", "6",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output.strip().splitlines()[-1])
    assert stats["problems"] == 6
    hints = pl.read_parquet(out / "hints.parquet")
    assert hints.height == 6 and set(hints["status"]) == {"accepted"}
    assert set(hints["hint"]) == {BACKEND_HINT}
    assert json.loads((out / "stats.json").read_text())["backend"]["kind"] == "toy"


def test_a_workflow_round_hints_and_rolls_out_with_the_toy(toy, tmp_path):
    """Two rounds: round 0 mines the real rollouts and hints with the toy; round 1's offline policy is the toy."""
    rollouts = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    best = rollouts.group_by("problem_id").agg(pl.col("correct").max()).sort("problem_id")
    ids = sorted(best.filter(pl.col("correct") == 0)["problem_id"].head(4).to_list()
                 + best.filter(pl.col("correct") > 0)["problem_id"].head(4).to_list())
    pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id").is_in(ids)).write_parquet(
        tmp_path / "problems.parquet")
    rollouts.filter(pl.col("problem_id").is_in(ids)).write_parquet(tmp_path / "initial.parquet")
    wf = {"name": "toy-rounds", "domain": "math", "base": str(tmp_path / "problems.parquet"), "rounds": 2,
          "initial_rollouts": {"source": [str(tmp_path / "initial.parquet")], "format": "canonical"},
          "trainer": {"kind": "offline", "policy": {"backend": "toy"}, "rollout": {"k": 2}},
          "mine": {"k_failed": 2}, "hint": {"backend": {"backend": "toy"}}, "build": {}}
    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(wf))
    run_dir = tmp_path / "run"
    r = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir)])
    assert r.exit_code == 0, r.output
    hints = pl.concat([pl.read_parquet(p) for p in sorted(run_dir.rglob("hints.parquet"))])
    toys = hints.filter(pl.col("status") != "fallback")  # round 1 may not repeat round 0's hint: a fallback there
    assert toys.height >= 4 and set(toys["hint"]) == {BACKEND_HINT}
    answered = [p for p in run_dir.rglob("*.parquet") if "rollouts" in p.parts and "response" in pl.read_parquet_schema(p)]
    assert answered and any("toy says 42" in set(pl.read_parquet(p)["response"]) for p in answered)


def test_doctor_checks_the_toy(toy, tmp_path):
    r = CliRunner().invoke(cli, ["doctor", "--json", "--role", "hint", "--backend", "toy", "--out", str(tmp_path)])
    checks = {c["name"]: c for c in json.loads(r.stdout.strip().splitlines()[-1])}
    assert checks["engine"]["status"] == "ok", checks["engine"]
    assert checks["engine"]["detail"].startswith("backend toy answered one JSON-schema request")


def test_a_backend_that_serves_and_its_cpu_fixes(toy):
    """`mentor serve` starts the server its backend kind declares (`serves`, `serve_command`), `mentor setup-cpu` runs
    every kind's `cpu_setup` and shows its note: the toy's, from its one file, beside vLLM's."""
    r = CliRunner().invoke(cli, ["serve", "--backend", "toy", "--port", "8765", "--print-only"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "TOY_SERVER=1 /bin/echo toy-server toy 8765"
    r = CliRunner().invoke(cli, ["serve", "--print-only"])  # the default: the first kind that serves (vLLM)
    assert r.exit_code == 0 and "toy-server" not in r.output and "--port 8000" in r.output, r.output
    r = CliRunner().invoke(cli, ["serve", "--backend", "fake", "--print-only"])
    assert r.exit_code == 2 and "fake serves no model; choose vllm, toy" in r.output, r.output
    r = CliRunner().invoke(cli, ["setup-cpu", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "$ pip uninstall -y toy-cpu-conflict" in r.output and "note: the toy needs no CPU fixes but this note" in r.output
