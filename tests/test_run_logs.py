"""A rollout log folder shared by several runs: each run writes, reads and cleans its own shards only.

A TRL or verl round removes the shards an earlier, killed attempt of the same round left before it
launches (the rerun scores those prompts again). Before the run identity, it removed every ``trl-*`` /
``verl-*`` shard of the folder, another run's included.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fake_trainers import fake_trainer
from mentor.workflows.cli import cli
from mentor.stages.build import BUILD, BuildConfig
from mentor.training.rollout_log import ENV_RUN, RolloutLog, run_identity, run_shards


def _shard(directory: Path, trainer: str, run: str | None, problem: str) -> Path:
    log = RolloutLog(directory, trainer, run=run)
    log.write({"problem_id": problem})
    log.close()
    return log.path


def test_a_shard_carries_the_run_in_its_name_and_records(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUN, "abc123abc123")
    log = RolloutLog(tmp_path, "verl")
    log.write({"problem_id": "p"})
    assert log.path.name.startswith("verl-abc123abc123-")
    assert json.loads(log.path.read_text())["run"] == "abc123abc123"
    assert run_shards(tmp_path, "verl", "abc123abc123") == [log.path]
    assert run_shards(tmp_path, "verl", "ffffffffffff") == []
    a, b = tmp_path / "run-a" / "round-001" / "train", tmp_path / "run-b" / "round-001" / "train"
    assert run_identity(a) == run_identity(a) != run_identity(b)


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "round-001"
    BUILD({}, BuildConfig(base="gsm8k", round=1), d / "prompts")
    return d


def test_a_trl_round_keeps_another_runs_shards_in_a_shared_folder(tmp_path, round_dir, shared_data):
    pytest.importorskip("trl")
    shared = tmp_path / "shared-log"
    other_run = _shard(shared, "trl", run_identity(tmp_path / "other" / "round-001" / "train"), "theirs")
    unnamed = _shard(shared, "trl", None, "outside")  # a writer outside `mentor train`: no identity
    train = round_dir / "train"
    killed = _shard(shared, "trl", run_identity(train), "ours")  # this round's own killed attempt
    cfg = {"kind": "trl", "round": 0, "round_dir": str(round_dir), "rollout_log_dir": str(shared),
           "base_model": str(shared_data / "tokenizers" / "qwen3"), "limit": 4, "use_cpu": True,
           "max_completion_length": 256, "python": fake_trainer(tmp_path / "python", "sys.exit(3)\n")}
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["train", "--config", str(path)])
    assert res.exit_code == 1 and "exited with code 3" in res.output, res.output
    assert other_run.is_file() and unnamed.is_file()
    assert not killed.exists()
    outcome = json.loads((train / "outcome.json").read_text())
    assert outcome["rollout_run"] == run_identity(train)
    assert "removed 1 rollout shard(s) of an earlier, unfinished attempt of this run" in (train / "train.log").read_text()


def test_verl_resume_and_restart_touch_this_runs_shards_only(tmp_path):
    pytest.importorskip("verl")
    from mentor.training.verl.checkpoints import last_checkpoint, prepare_logs

    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    (ckpt / "global_step_20" / "actor").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    cut = (ckpt / "latest_checkpointed_iteration.txt").stat().st_mtime
    logs.mkdir()
    late = "".join(json.dumps({"problem_id": f"p{i}", "ts": cut + 5}) + "\n" for i in range(3))
    theirs = logs / "verl-0123456789ab-host-1-aa.jsonl"
    theirs.write_text(late)
    ours = logs / "verl-ba9876543210-host-2-bb.jsonl"
    ours.write_text(late)
    assert prepare_logs(logs, last_checkpoint(ckpt), "ba9876543210") == (
        "resuming from checkpoint step 20: dropped 3 rollout record(s) logged after it")
    assert ours.read_text() == "" and theirs.read_text() == late
    assert prepare_logs(logs, None, "ba9876543210") == "removed 1 rollout shard(s) of an earlier, unfinished attempt"
    assert sorted(p.name for p in logs.iterdir()) == [theirs.name]


def test_the_reward_file_logs_under_the_run_the_launcher_set(tmp_path):
    """The trainer's reward process gets MENTOR_RUN_ID from the launcher's environment and names its shard so."""
    code = ("import sys; from mentor.training.rollout_log import rollout_log; "
            "w = rollout_log(sys.argv[1], 'verl'); w.write({'problem_id': 'p'}); print(w.path.name)")
    env = {"MENTOR_RUN_ID": "0a0a0a0a0a0a", "PATH": "/usr/bin:/bin"}
    name = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert name.startswith("verl-0a0a0a0a0a0a-")
