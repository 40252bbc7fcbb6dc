"""Issue 60: one plugin folder adds a stage, an agent, a rule, a backend and a trainer, one new file each
(tests/toy_plugins.py), and ONE `mentor run` round uses all five.

The toy trainer trains the round on 16 real GSM8K problems (it solves the first 10); mine finds the other
6 collapsed; the hint stage runs on the toy backend with the toy agent among its agents (asked once per
problem, after attribution) and the toy rule among its rules (it rejects the toy backend's hint, which
says "exactly": every problem ends on the keyword fallback, the rule counted); build writes the prompts and
the toy stage, declared after build, writes one line per collapsed problem. The round runs in its own
``mentor`` process, as a user would run it: the plugin path is read when mentor starts. Each toy also runs
through its own command in tests/test_extension_{stage,agent_rule,backend,trainer}.py.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pyarrow.parquet as pq
import yaml
from toy_plugins import PLUGINS, mentor, write_plugins

from mentor.data import bundled


def test_one_round_runs_the_toy_stage_agent_rule_backend_and_trainer(tmp_path):
    folder = write_plugins(tmp_path / "plugins", *PLUGINS)
    env = os.environ | {"MENTOR_PLUGIN_PATH": str(folder)}
    env.pop("MENTOR_ROLLOUT_DIR", None)
    frame = pl.read_parquet(bundled("gsm8k_problems.parquet")).sort("problem_id").head(16)
    frame.write_parquet(tmp_path / "problems.parquet")
    ids = frame["problem_id"].to_list()
    wf = {"name": "toys", "domain": "math", "base": str(tmp_path / "problems.parquet"), "rounds": 1,
          "trainer": {"kind": "toy", "config": {"k": 4, "solved": ids[:10]}}, "mine": {"k_failed": 2},
          "hint": {"backend": {"backend": "toy"}, "config": {"judge_check": {"enabled": False}}}}
    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(wf))
    run_dir = tmp_path / "run"
    res = mentor(env, "run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    r0 = run_dir / "round-000"

    # The toy trainer trained the round: its outcome, and its rollouts logged through mentor's reward core.
    assert json.loads((r0 / "train" / "outcome.json").read_text())["ok"]
    records = [json.loads(line) for f in sorted((r0 / "train" / "logs").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(records) == 16 * 4 and {r["trainer"] for r in records} == {"toy"}
    collapsed = pl.read_parquet(r0 / "collapsed" / "collapsed.parquet")["problem_id"].to_list()
    assert sorted(collapsed) == sorted(ids[10:])  # exactly the problems it answered wrong

    # The toy backend was the hint model; the toy agent was asked once per problem; the toy rule was counted.
    (hints_file,) = r0.rglob("hints.parquet")
    stats = json.loads((hints_file.parent / "stats.json").read_text())
    assert stats["backend"]["kind"] == "toy"
    assert stats["requests_by_agent"]["toy_focus"] == 6 and stats["toy_focus_used"] == 6, stats["requests_by_agent"]
    assert stats["violations"]["toy_exactly"] >= 6, stats["violations"]
    rows = pq.read_table(hints_file).to_pylist()
    assert sorted(r["problem_id"] for r in rows) == sorted(collapsed)
    for row in rows:
        agents = [e["agent"] for e in row["trace"]]
        assert agents[:3] == ["attribution", "toy_focus", "generation"], agents
        assert json.loads(row["trace"][1]["parsed"]) == {"focus": "toy"}  # the toy backend's answer to the toy agent
        assert row["keywords"][-1] == "toy"  # the agent's consume used it
        assert "toy_exactly" in row["violations"] and row["status"] == "fallback"
        assert "exactly" not in row["hint"].lower()
    assert list((r0 / "prompts").glob("part-*.parquet"))  # build wrote the round's prompts

    # The toy stage ran after build, over the round's collapsed problems, and is a row of `mentor status`.
    lines = [json.loads(line) for line in (r0 / "toys" / "toy.jsonl").read_text().splitlines()]
    assert lines == [{"problem_id": i, "label": "round"} for i in collapsed]
    status = mentor(env, "status", str(run_dir), "--format", "json")
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)
    assert [r["stage"] for r in rows] == ["train", "ingest", "mine", "hint", "build", "toy"]
    assert {r["state"] for r in rows} == {"done"}
