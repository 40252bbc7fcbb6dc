"""`mentor run`: a two-round offline workflow on real GSM8K problems, resume, config changes, kills, dask.

The policy and the hint model are deterministic fakes (tests only) defined in a
small module written to tmp_path, so that subprocess runs can import them too:
- the policy answers correctly only when its prompt carries a hint and the
  problem is one of the "rescuable" half; otherwise it answers -1;
- the hint model writes a per-problem, answer-free hint, and a different
  ("more specifically") one when the generation prompt carries a previous hint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from mentor.data import bundled
from mentor.workflows.cli import cli
from mentor.workflows.config import validate_workflow
from mentor.workflows.runner import RunOptions, Runner, run_status

FAKES = '''
import json, polars as pl
PROBLEMS = pl.read_parquet(__PROBLEMS__)
RESCUABLE = set(__RESCUABLE__)
TEXTS = list(zip(PROBLEMS["problem_id"], PROBLEMS["problem"], PROBLEMS["label"]))
LETTERS = "abcdefghijklmnop"

def _find(text):
    for pid, problem, label in TEXTS:
        if problem in text:
            return pid, label
    raise AssertionError("unknown problem in prompt")

def policy(req):
    user = req.messages[-1]["content"]
    pid, label = _find(user)
    if "Hint:" in user and pid in RESCUABLE:
        return "Let me think step by step. The answer is \\\\boxed{" + label + "}."
    return "I think the answer is \\\\boxed{-1}."

def hinter(req):
    props = (req.json_schema or {}).get("properties", {})
    pid, _ = _find("\\n".join(m["content"] for m in req.messages))
    tag = "".join(LETTERS[int(c, 16)] for c in pid.split("-")[-1][:6])
    if "keywords" in props:
        return json.dumps({"keywords": ["quantity asked", "units"], "error": "They answer a different quantity."})
    if "score" in props:
        return json.dumps({"score": 8, "feedback": "Specific and answer-free."})
    user = req.messages[-1]["content"]
    if "Hint " + tag in user:  # the previous hint is in the prompt: escalate
        return json.dumps({"hint": "Hint " + tag + " more specifically: write down each quantity with its unit before combining any two."})
    return json.dumps({"hint": "Hint " + tag + ": decide which quantity the question asks for before computing anything."})

def broken_hinter(req):
    """A hint model that fails on every request (found only once the stage runs)."""
    raise RuntimeError("broken_hinter: the model says no")

def flaky_hinter(req):
    """The hinter, but its engine dies on one problem while the flag file exists."""
    import os
    from mentor.pipeline.errors import EngineError
    pid, _ = _find("\\n".join(m["content"] for m in req.messages))
    if os.path.exists(__FLAG__) and pid == __VICTIM__:
        raise EngineError("the vLLM engine failed on a batch of 2 requests (EngineDeadError after RuntimeError: boom)")
    return hinter(req)
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """12 real GSM8K problems (6 collapsed in the real rollouts), their real rollouts, and the fakes module."""
    d = tmp_path_factory.mktemp("wf")
    rollouts = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    best = rollouts.group_by("problem_id").agg(pl.col("correct").max()).sort("problem_id")
    collapsed = best.filter(pl.col("correct") == 0)["problem_id"].head(6).to_list()
    solved = best.filter(pl.col("correct") > 0)["problem_id"].head(6).to_list()
    ids = sorted(collapsed + solved)
    problems = pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id").is_in(ids))
    problems.write_parquet(d / "problems.parquet")
    rollouts.filter(pl.col("problem_id").is_in(ids)).write_parquet(d / "initial.parquet")
    rescuable = sorted(collapsed)[:3]
    fakes = FAKES.replace("__PROBLEMS__", repr(str(d / "problems.parquet"))).replace("__RESCUABLE__", repr(rescuable))
    # With shard_size 2 the 6 collapsed problems make 3 hint shards; the victim sits in the second.
    fakes = fakes.replace("__FLAG__", repr(str(d / "engine-dies"))).replace("__VICTIM__", repr(sorted(collapsed)[2]))
    (d / "wf_fakes.py").write_text(fakes)
    sys.path.insert(0, str(d))
    wf = {
        "name": "two-rounds",
        "domain": "math",
        "base": str(d / "problems.parquet"),
        "rounds": 2,
        "initial_rollouts": {"source": [str(d / "initial.parquet")], "format": "canonical"},
        "trainer": {"kind": "offline", "policy": {"backend": "fake", "options": {"script": "wf_fakes:policy"}},
                    "rollout": {"k": 4}},
        "mine": {"k_failed": 2},
        "hint": {"backend": {"backend": "fake", "options": {"script": "wf_fakes:hinter"}}, "config": {"shard_size": 2}},
        "build": {},
    }
    (d / "wf.yaml").write_text(yaml.safe_dump(wf))
    yield {"dir": d, "wf": wf, "collapsed": sorted(collapsed), "solved": solved, "rescuable": rescuable}
    sys.path.remove(str(d))


def _run(wf: dict, run_dir: Path, **opts) -> Runner:
    runner = Runner(validate_workflow(wf), run_dir, RunOptions(progress=False, **opts))
    runner.run()
    return runner


def _datasets(run_dir: Path) -> dict[str, bytes]:
    """Every data file of a run (not bookkeeping), by relative path."""
    out = {}
    for f in sorted(run_dir.rglob("*.parquet")):
        rel = f.relative_to(run_dir)
        if any(p.startswith(("_", ".")) for p in rel.parts):
            continue
        out[str(rel)] = f.read_bytes()
    return out


@pytest.fixture(scope="module")
def reference_run(setup, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    runner = _run(setup["wf"], run_dir)
    return run_dir, runner


def test_two_rounds_end_to_end(setup, reference_run):
    run_dir, runner = reference_run
    assert len(runner.ran) == 10  # 5 stages x 2 rounds
    c0 = pl.read_parquet(run_dir / "round-000/collapsed/collapsed.parquet")
    assert sorted(c0["problem_id"]) == setup["collapsed"]
    h0 = pl.read_parquet(run_dir / "round-000/hints/hints.parquet")
    assert sorted(h0["problem_id"]) == setup["collapsed"]
    assert set(h0["status"]) == {"accepted"}
    # round 1 trains on prompts carrying round 0's hints
    p0 = pl.read_parquet(run_dir / "round-000/prompts/part-00000.parquet")
    assert p0.height == 12
    hinted = p0.filter(pl.col("hint_id").is_not_null())
    assert sorted(hinted["problem_id"]) == setup["collapsed"]
    for row in hinted.iter_rows(named=True):
        hint = h0.filter(pl.col("problem_id") == row["problem_id"])["hint"][0]
        assert hint in row["prompt"][-1]["content"]
        assert json.loads(row["label"])["problem_id"] == row["problem_id"]
        assert json.loads(row["label"])["round"] == 1
    # round 1: rescued problems are no longer collapsed; the others are, with an escalated hint
    r1 = pl.read_parquet(run_dir / "round-001/rollouts/part-00000.parquet")
    assert r1["round"].unique().to_list() == [1]
    c1 = pl.read_parquet(run_dir / "round-001/collapsed/collapsed.parquet")
    still = sorted(set(setup["collapsed"]) - set(setup["rescuable"]))
    assert not set(setup["rescuable"]) & set(c1["problem_id"])
    assert set(still) <= set(c1["problem_id"])
    chain = c1.filter(pl.col("problem_id").is_in(still))
    assert chain["streak"].unique().to_list() == [2]
    h1 = pl.read_parquet(run_dir / "round-001/hints/hints.parquet")
    for pid in still:
        prev = h0.filter(pl.col("problem_id") == pid)["hint"][0]
        assert chain.filter(pl.col("problem_id") == pid)["previous_hints"][0].to_list() == [prev]
        new = h1.filter(pl.col("problem_id") == pid)["hint"][0]
        assert "more specifically" in new and new != prev
    # newly collapsed (solved in round 0, unhinted now, so wrong) have a streak of 1
    fresh = c1.filter(pl.col("problem_id").is_in(setup["solved"]))
    assert fresh.height == 6 and fresh["streak"].unique().to_list() == [1]
    p1 = pl.read_parquet(run_dir / "round-001/prompts/part-00000.parquet")
    assert set(p1["round"].unique()) == {2}
    assert (run_dir / "workflow.yaml").exists()


def test_status_and_inspect_report_the_run(setup, reference_run):
    run_dir, _ = reference_run
    rows = run_status(run_dir)
    assert len(rows) == 10 and {r["state"] for r in rows} == {"done"}
    mine0 = next(r for r in rows if r["round"] == 0 and r["stage"] == "mine")
    assert mine0["rows"] == 6 and mine0["problems"] == 12
    res = CliRunner().invoke(cli, ["status", str(run_dir)])
    assert res.exit_code == 0 and "collapse_rate" in res.output
    pid = sorted(set(setup["collapsed"]) - set(setup["rescuable"]))[0]
    res = CliRunner().invoke(cli, ["inspect", str(run_dir), "--problem", pid, "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.dumps(json.loads(res.output))
    assert "more specifically" in out  # the escalated hint of round 1 is in the chain
    assert "decide which quantity" in out  # and round 0's hint


def test_rerun_skips_everything(setup, reference_run):
    run_dir, _ = reference_run
    before = _datasets(run_dir)
    runner = _run(setup["wf"], run_dir)
    assert runner.ran == []
    assert _datasets(run_dir) == before


def test_reused_runner_starts_round_zero_from_the_base_prompts(setup, tmp_path):
    """A second run() of one Runner trains round 0 on the base set again, not on the last round's build:
    with every stage done, it skips them all."""
    wf = {k: v for k, v in setup["wf"].items() if k != "initial_rollouts"}  # round 0 rolls out the base prompts
    runner = _run(wf, tmp_path / "run")
    assert (0, "train") in runner.ran and (1, "train") in runner.ran
    first = list(runner.ran)
    before = _datasets(tmp_path / "run")
    runner.run()
    assert runner.ran == first
    assert _datasets(tmp_path / "run") == before


def test_config_change_reruns_that_stage_and_after(setup, tmp_path):
    run_dir = tmp_path / "run"
    _run(setup["wf"], run_dir)
    wf = json.loads(json.dumps(setup["wf"]))
    wf["hint"]["config"]["max_refine"] = 3
    runner = _run(wf, run_dir)
    assert (0, "ingest") not in runner.ran and (0, "mine") not in runner.ran
    assert (0, "hint") in runner.ran and (0, "build") in runner.ran
    assert {s for r, s in runner.ran if r == 1} == {"train", "ingest", "mine", "hint", "build"}


def test_only_and_from_stage(setup, reference_run, tmp_path):
    run_dir, _ = reference_run
    runner = _run(setup["wf"], run_dir, only="build")
    assert runner.ran == [(0, "build"), (1, "build")]
    runner = _run(setup["wf"], run_dir, from_stage="hint", rounds=1)
    assert runner.ran == [(0, "hint"), (0, "build")]


def _all_parquet_readable(run_dir: Path) -> None:
    for f in run_dir.rglob("*.parquet"):
        pq.read_metadata(f)  # raises on a partial file


@pytest.mark.parametrize("point", ["mine.after_collapsed", "hint.after_shard", "build.after_shards", "ingest.before_marker"])
def test_sigkill_and_resume_gives_the_same_outputs(setup, reference_run, tmp_path, point):
    ref_dir, _ = reference_run
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "mentor.workflows.cli", "run", str(setup["dir"] / "wf.yaml"), "--run-dir", str(run_dir)]
    env = os.environ | {"PYTHONPATH": str(setup["dir"]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "MENTOR_FAULT": point, "MENTOR_FAULT_SKIP": "1" if point == "hint.after_shard" else "0"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _all_parquet_readable(run_dir)
    env.pop("MENTOR_FAULT")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _datasets(run_dir) == _datasets(ref_dir)
    assert not list(run_dir.rglob(".*.tmp"))


def test_localcluster_same_rows(setup, reference_run, tmp_path):
    from mentor.pipeline.executor import dask_client

    ref_dir, _ = reference_run
    run_dir = tmp_path / "run"
    env_path = str(setup["dir"])
    with dask_client(workers=2) as client:
        client.run(lambda: sys.path.insert(0, env_path))
        _run(setup["wf"], run_dir, client=client)
    assert _datasets(run_dir) == _datasets(ref_dir)


def test_failed_stage_is_reported_by_status_and_resumes(setup, tmp_path):
    """A stage that raises is marked failed with its error; fixing the cause and re-running finishes the run."""
    run_dir = tmp_path / "run"
    wf = json.loads(json.dumps(setup["wf"]))
    wf["hint"]["backend"]["options"]["script"] = "wf_fakes:broken_hinter"
    with pytest.raises(Exception, match="broken_hinter"):
        _run(wf, run_dir, rounds=1)
    rows = {(r["round"], r["stage"]): r for r in run_status(run_dir)}
    assert rows[(0, "mine")]["state"] == "done"
    assert rows[(0, "hint")]["state"] == "failed" and "broken_hinter" in rows[(0, "hint")]["error"]
    assert rows[(0, "build")]["state"] == "pending"
    res = CliRunner().invoke(cli, ["status", str(run_dir)])
    assert "failed" in res.output and "broken_hinter" in res.output
    runner = _run(setup["wf"], run_dir, rounds=1)
    assert runner.ran == [(0, "hint"), (0, "build")]
    assert {r["state"] for r in run_status(run_dir)} == {"done"}


def test_engine_failure_mid_stage_is_one_error_and_a_rerun_redoes_only_unfinished_shards(setup, reference_run, tmp_path):
    run_dir = tmp_path / "run"
    flag = setup["dir"] / "engine-dies"
    wf = json.loads(json.dumps(setup["wf"]))
    wf["hint"]["backend"]["options"]["script"] = "wf_fakes:flaky_hinter"
    wf["hint"]["config"]["judge_check"] = {"enabled": False}  # the victim would die in the judge check, before any shard
    flag.write_text("")
    try:
        res = CliRunner().invoke(cli, ["run", str(_write(tmp_path / "wf.yaml", wf)), "--run-dir", str(run_dir),
                                       "--rounds", "1"])
    finally:
        flag.unlink()
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: hint: shard 2 of 3 (2 problems") and "RuntimeError: boom" in lines[-1]
    assert "Traceback" not in res.output
    rows = {(r["round"], r["stage"]): r for r in run_status(run_dir)}
    assert rows[(0, "hint")]["state"] == "failed" and rows[(0, "hint")]["error"].startswith("hint: shard 2 of 3")
    assert rows[(0, "build")]["state"] == "pending"
    # Rerun (the engine is healthy again): shard 1 is reused, shards 2 and 3 are hinted.
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-dir", str(run_dir), "--rounds", "1"])
    assert res.exit_code == 0, res.output
    stats = json.loads((run_dir / "round-000" / "hints" / "stats.json").read_text())
    assert stats["this_run"] == {"engine_calls": stats["this_run"]["engine_calls"], "shards_computed": 2, "shards_reused": 1}
    ref = pq.read_table(reference_run[0] / "round-000" / "hints" / "hints.parquet").select(["problem_id", "hint"])
    assert pq.read_table(run_dir / "round-000" / "hints" / "hints.parquet").select(["problem_id", "hint"]).equals(ref)


def _write(path: Path, wf: dict) -> Path:
    path.write_text(yaml.safe_dump(wf))
    return path
