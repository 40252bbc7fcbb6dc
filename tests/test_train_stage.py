"""The train stage's kinds that need no GPU, through the workflow runner: a user's verl command and an
external trainer, each logging with mentor's real verl reward function on real GSM8K prompt shards,
their logs ingested and mined in the same round."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import polars as pl
import pytest

from mentor.data import bundled
from mentor.pipeline.errors import DataError
from mentor.pipeline.stage import read_done
from mentor.workflows.config import validate_workflow
from mentor.workflows.runner import RunOptions, Runner

# A stand-in trainer: every prompt row of the round's shards answered k=4 times through verl's reward
# entry point (`compute_score`), right for the ids in SOLVED and wrong for the others.
TRAINER = '''
import glob, json, os, sys
import pyarrow.parquet as pq
from mentor.training.verl.reward import compute_score

prompts, solved, out = sys.argv[1], set(json.loads(sys.argv[2])), sys.argv[3]
assert os.environ["MENTOR_ROLLOUT_DIR"], "the round's rollout dir reaches the trainer"
for f in sorted(glob.glob(os.path.join(prompts, "part-*.parquet"))):
    for row in pq.read_table(f).to_pylist():
        truth = row["reward_model"]["ground_truth"]
        answer = truth if row["problem_id"] in solved else "-1"
        for _ in range(4):
            compute_score(row["data_source"], "So the answer is \\\\boxed{" + answer + "}.", truth, row["extra_info"])
if out:
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "DONE"), "w").close()
'''


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """16 real GSM8K problems; the first 10 (by id) are answered right by the stand-in trainer."""
    d = tmp_path_factory.mktemp("train")
    frame = pl.read_parquet(bundled("gsm8k_problems.parquet")).sort("problem_id").head(16)
    frame.write_parquet(d / "problems.parquet")
    (d / "trainer.py").write_text(TRAINER)
    return d, frame["problem_id"].to_list()


def _workflow(d: Path, trainer: dict) -> dict:
    return {"name": "t", "domain": "math", "base": str(d / "problems.parquet"), "rounds": 1, "trainer": trainer,
            "mine": {"k_failed": 2},
            "hint": {"backend": {"backend": "fake"}, "config": {"judge_check": {"enabled": False}}}}


def _run(wf: dict, run_dir: Path) -> Runner:
    runner = Runner(validate_workflow(wf), run_dir, RunOptions(progress=False))
    runner.run()
    return runner


def _marker(run_dir: Path, stage: str) -> dict:
    folder = {"train": "train", "mine": "collapsed"}[stage]
    (marker,) = (run_dir / "round-000" / folder / "_done").glob("*.done")
    return read_done(marker)


def test_a_verl_command_round_is_ingested_and_mined(problems, tmp_path):
    d, ids = problems
    solved = ids[:10]
    trainer = {"kind": "verl", "command": [sys.executable, str(d / "trainer.py"), "{prompts}", json.dumps(solved), ""],
               "model_out": "{run_dir}/model-{round}"}
    run_dir = tmp_path / "run"
    runner = _run(_workflow(d, trainer), run_dir)
    assert [s for _, s in runner.ran] == ["train", "ingest", "mine", "hint", "build"]
    train = _marker(run_dir, "train")
    assert train["kind"] == "verl" and train["exit_code"] == 0 and train["final_model"] == f"{run_dir}/model-0"
    outcome = json.loads((run_dir / "round-000" / "train" / "outcome.json").read_text())
    assert list(Path(outcome["command"][2]).glob("part-*.parquet"))  # {prompts} became the round's prompt shards
    logs = list((run_dir / "round-000" / "train" / "logs").glob("verl-*.jsonl"))
    assert logs and sum(len(f.read_text().splitlines()) for f in logs) == 16 * 4
    collapsed = pl.read_parquet(run_dir / "round-000" / "collapsed" / "collapsed.parquet")
    assert sorted(collapsed["problem_id"].to_list()) == sorted(ids[10:])  # exactly the problems answered wrong
    assert _marker(run_dir, "mine")["collapsed"] == 6
    # A second run finds every stage done.
    again = _run(_workflow(d, trainer), run_dir)
    assert again.ran == [] and len(again.skipped) == 5


def test_a_failing_verl_command_stops_the_round_with_its_log(problems, tmp_path):
    d, _ = problems
    trainer = {"kind": "verl", "command": [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]}
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match=r"(?s)the verl command exited with 3.*CUDA out of memory"):
        _run(_workflow(d, trainer), run_dir)
    outcome = json.loads((run_dir / "round-000" / "train" / "outcome.json").read_text())
    assert outcome["exit_code"] == 3 and outcome["final_model"] is None
    assert not (run_dir / "round-000" / "rollouts").exists()  # nothing after the failed round ran


def test_an_external_trainer_round_waits_for_its_sentinel(problems, tmp_path):
    """The logs an external trainer wrote (the real reward function, in its own process) are ingested once
    the sentinel appears; files the glob matches are what ingest reads."""
    d, ids = problems
    run_dir = tmp_path / "run"
    ext = tmp_path / "ext" / "round-0"
    base_prompts = tmp_path / "prompts"
    # The external trainer trains on prompts mentor built; here the base set's, built the same way.
    from mentor.stages.build import BUILD

    BUILD({}, {"base": str(d / "problems.parquet"), "hints": [], "round": 0}, base_prompts)
    env = os.environ | {"MENTOR_ROLLOUT_DIR": str(ext)}
    import subprocess

    subprocess.run([sys.executable, str(d / "trainer.py"), str(base_prompts), json.dumps(ids[:4]), str(ext)], env=env,
                   check=True)
    trainer = {"kind": "external", "rollouts": str(tmp_path / "ext" / "round-{round}" / "*.jsonl"),
               "sentinel": str(tmp_path / "ext" / "round-{round}" / "DONE"), "poll_s": 0.05, "timeout_s": 30}
    _run(_workflow(d, trainer), run_dir)
    train = _marker(run_dir, "train")
    assert train["kind"] == "external" and train["files"] == sorted(map(str, ext.glob("*.jsonl")))
    collapsed = pl.read_parquet(run_dir / "round-000" / "collapsed" / "collapsed.parquet")
    assert sorted(collapsed["problem_id"].to_list()) == sorted(ids[4:])


def test_an_external_trainer_that_never_finishes_times_out(problems, tmp_path):
    d, _ = problems
    trainer = {"kind": "external", "rollouts": str(tmp_path / "none" / "*.jsonl"), "poll_s": 0.05, "timeout_s": 0.3}
    with pytest.raises(DataError, match=r"round 0: no complete rollout logs matched .*none/\*\.jsonl within 0s"):
        _run(_workflow(d, trainer), tmp_path / "run")
