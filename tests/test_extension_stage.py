"""A stage is added as one new file: a toy stage in a plugin folder runs through `mentor stage` and a `mentor run` round.

The toy (``<plugin folder>/stages/toy.py`` on ``MENTOR_PLUGIN_PATH``, nothing else; tests/toy_plugins.py) reads the
round's collapsed problems and writes one line per problem; it declares its folder in a round,
its place (after build), what it reads from the round (`Stage.round_job`) and its status
columns. The runner, `mentor status`, `--only`/`--from-stage` and the driver's done markers
pick it up from that declaration alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from click.testing import CliRunner
from toy_plugins import write_plugins

from mentor.data import bundled
from mentor.workflows.cli import cli



@pytest.fixture
def plugin(tmp_path, monkeypatch):
    folder = write_plugins(tmp_path / "plugins", "stage")
    monkeypatch.setenv("MENTOR_PLUGIN_PATH", str(folder))
    return folder


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_toy_stage_runs_through_mentor_stage(plugin, tmp_path):
    logs = str(bundled("gsm8k_rollouts.parquet"))
    res = CliRunner().invoke(cli, ["mine", logs, "--out", str(tmp_path / "mined"), "--k-failed", "1"])
    assert res.exit_code == 0, res.output
    collapsed = tmp_path / "mined" / "collapsed.parquet"
    want = pl.read_parquet(collapsed)["problem_id"].to_list()
    assert want

    res = CliRunner().invoke(cli, ["stage", "toy", "--input", f"collapsed={collapsed}", "--set", "label=cli",
                                   "--out", str(tmp_path / "toy")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["problems"] == len(want)
    assert _lines(tmp_path / "toy" / "toy.jsonl") == [{"problem_id": i, "label": "cli"} for i in want]
    assert json.loads((tmp_path / "toy" / "stats.json").read_text())["problems"] == len(want)

    # A setting the toy's Config does not declare is one usage line naming it.
    res = CliRunner().invoke(cli, ["stage", "toy", "--input", f"collapsed={collapsed}", "--set", "colour=red",
                                   "--out", str(tmp_path / "toy2")])
    assert res.exit_code == 2 and "colour" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(cli, ["stage", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "toy" in res.output and "mine" in res.output, res.output


def test_toy_stage_runs_in_a_mentor_run_round(plugin, tmp_path):
    rollouts = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    ids = rollouts["problem_id"].unique().sort().head(12).to_list()
    pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id").is_in(ids)).write_parquet(
        tmp_path / "problems.parquet")
    rollouts.filter(pl.col("problem_id").is_in(ids)).write_parquet(tmp_path / "initial.parquet")
    wf = {"name": "toy-round", "base": str(tmp_path / "problems.parquet"), "rounds": 1,
          "initial_rollouts": {"source": [str(tmp_path / "initial.parquet")], "format": "canonical"},
          "trainer": {"kind": "offline"}, "mine": {"k_failed": 1},
          "hint": {"backend": {"backend": "fake"}}}
    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(wf))
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir)])
    assert res.exit_code == 0, res.output

    collapsed = pl.read_parquet(run_dir / "round-000" / "collapsed" / "collapsed.parquet")["problem_id"].to_list()
    toys = run_dir / "round-000" / "toys"
    assert _lines(toys / "toy.jsonl") == [{"problem_id": i, "label": "round"} for i in collapsed]
    markers = list((toys / "_done").glob("*.done"))  # written by the driver, as for every stage
    assert len(markers) == 1 and json.loads(markers[0].read_text())["problems"] == len(collapsed)

    res = CliRunner().invoke(cli, ["status", str(run_dir), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    toy = [r for r in rows if r["stage"] == "toy"]
    assert [r["stage"] for r in rows] == ["train", "ingest", "mine", "hint", "build", "toy"]
    assert toy == [{"round": 0, "stage": "toy", "state": "done", "rows": len(collapsed), "toy_labelled": len(collapsed)}]
    res = CliRunner().invoke(cli, ["status", str(run_dir)])  # the table: its declared column, and its note below
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0].split()
    assert header[:3] == ["round", "stage", "state"] and header[-1] == "toy_labelled" and "collapse_rate" in header
    assert f"round 0: the toy labelled {len(collapsed)} problems" in res.output.splitlines()

    # Resumes like any stage: a rerun skips it; --only re-runs just it (its done marker renewed).
    before = markers[0].stat().st_mtime_ns
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir)])
    assert res.exit_code == 0 and markers[0].stat().st_mtime_ns == before, res.output
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir), "--only", "toy"])
    assert res.exit_code == 0, res.output
    assert [m.stat().st_mtime_ns for m in (toys / "_done").glob("*.done")] != [before]
