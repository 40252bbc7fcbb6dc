"""Rollout JSONL shards: 8 threads at once, a SIGKILLed writer, read back with `mentor ingest --format openrlhf`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import polars as pl
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.training.rollout_log import (
    CONFIG_NAME,
    ENV_DIR,
    RolloutLog,
    check_record,
    make_record,
    resolve_rollout_dir,
    rollout_log,
    write_reward_config,
)


def _rec(i: int, t: int = 0) -> dict:
    return make_record(
        problem_id=f"p-{i % 50}",
        round_=1,
        domain="math",
        prompt=f"prompt {i} with unicode ∑ and \"quotes\"\nand lines",
        response=f"thread {t} answer \\boxed{{{i}}}" + "x" * (i % 700),
        correct=float(i % 2),
        reward=float(i % 2),
        hint_id="h-1" if i % 3 else None,
        label=str(i),
        truncated=bool(i % 5 == 0),
    )


def _ingest(src: Path, out: Path) -> dict:
    res = CliRunner().invoke(cli, ["ingest", str(src), "--format", "openrlhf", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def test_records_match_the_schema_contract():
    rec = _rec(3)
    check_record(rec)
    bad = dict(rec)
    del bad["reward"]
    try:
        check_record(bad)
    except ValueError as exc:
        assert "reward" in str(exc)
    else:
        raise AssertionError("missing field accepted")


def test_eight_threads_at_once(tmp_path):
    log_dir = tmp_path / "log"
    writer = RolloutLog(log_dir)
    per_thread = 300

    def work(t: int) -> None:
        for i in range(per_thread):
            writer.write(_rec(t * per_thread + i, t))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    writer.close()
    lines = writer.path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == 8 * per_thread
    seqs = sorted(json.loads(line)["seq"] for line in lines[:-1])  # every line is whole JSON
    assert seqs == list(range(8 * per_thread))
    stats = _ingest(log_dir, tmp_path / "out")
    assert stats["rollouts"] == 8 * per_thread and stats["quarantined_total"] == 0
    df = pl.read_parquet(tmp_path / "out" / "*.parquet")
    assert df.height == 8 * per_thread
    assert df["source"][0].startswith("openrlhf:")
    assert set(df["truncated"].drop_nulls().unique()) == {True, False}


WRITER = textwrap.dedent(
    """
    import sys, time
    from mentor.training.rollout_log import make_record, rollout_log
    w = rollout_log(sys.argv[1])
    print(w.path, flush=True)
    i = 0
    while True:
        w.write(make_record(problem_id=f"p-{i % 7}", round_=2, domain="math", prompt="q" * 50,
                            response="r" * (i % 3000), correct=1.0, reward=1.0))
        i += 1
    """
)


def test_killed_writer_loses_nothing_before_the_kill(tmp_path):
    log_dir = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log_dir)], stdout=subprocess.PIPE, text=True)
    shard = Path(proc.stdout.readline().strip())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not shard.exists() or shard.stat().st_size < 2_000_000):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    data = shard.read_bytes()
    complete = data.count(b"\n")
    assert complete > 100
    seqs = [json.loads(line)["seq"] for line in data.split(b"\n")[:complete]]
    assert seqs == list(range(complete))  # contiguous: nothing before the kill is lost or torn
    # Simulate the worst case the format allows (a torn last line) and read back.
    with open(shard, "ab") as fh:
        fh.write(b'{"v": 1, "problem_id": "p-1", "round": 2, "dom')
    stats = _ingest(log_dir, tmp_path / "out")
    assert stats["rollouts"] == complete
    assert stats["quarantined"] == {"bad_json_line": 1}


def test_location_from_env_or_config_file(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    reward_file = tmp_path / "reward" / "openrlhf_reward.py"
    reward_file.parent.mkdir()
    reward_file.write_text("# placeholder\n")
    assert resolve_rollout_dir(reward_file) is None
    write_reward_config(reward_file.parent, tmp_path / "from-file")
    assert (reward_file.parent / CONFIG_NAME).exists()
    assert resolve_rollout_dir(reward_file) == (tmp_path / "from-file").resolve()
    (reward_file.parent / CONFIG_NAME).write_text(json.dumps({"rollout_dir": "rel"}))
    assert resolve_rollout_dir(reward_file) == reward_file.parent.resolve() / "rel"
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "from-env"))
    assert resolve_rollout_dir(reward_file) == tmp_path / "from-env"
    # One shard per process and directory.
    assert rollout_log(tmp_path / "a") is rollout_log(tmp_path / "a")
    assert rollout_log(tmp_path / "a") is not rollout_log(tmp_path / "b")


def test_settings_travel_in_the_ray_job_config(tmp_path, monkeypatch):
    import pytest

    from mentor.pipeline.errors import ConfigError
    from mentor.training.openrlhf.launcher import TrainConfig, build_env
    from mentor.training.rollout_log import RAY_JOB_CONFIG_ENV, ray_job_config_env, reward_env_vars, run_identity

    monkeypatch.setenv("MENTOR_CODE_TIMEOUT", "7")
    monkeypatch.setenv("UNRELATED", "x")
    monkeypatch.delenv(RAY_JOB_CONFIG_ENV, raising=False)
    cfg = TrainConfig(round=2, round_dir=str(tmp_path / "round-002"), base_model="m", actor_model="m", env={"MENTOR_ROLLOUT_FSYNC": "1"})
    env = build_env(cfg)
    job = json.loads(env[RAY_JOB_CONFIG_ENV])
    assert job == {"runtime_env": {"env_vars": {
        "MENTOR_CODE_TIMEOUT": "7", "MENTOR_ROLLOUT_FSYNC": "1", "MENTOR_ROUND": "2",
        ENV_DIR: str(tmp_path / "round-002" / "rollouts" / "log"),
        "MENTOR_RUN_ID": run_identity(tmp_path / "round-002" / "train"),
    }}}
    # Inside `ray job submit`: its runtime env (working_dir, its own variables) is kept, mentor's dir wins.
    outer = json.dumps({"runtime_env": {"working_dir": "/code", "env_vars": {"NCCL_DEBUG": "INFO", ENV_DIR: "/elsewhere"}},
                        "metadata": {"job": "a"}})
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, outer)
    job = json.loads(build_env(cfg)[RAY_JOB_CONFIG_ENV])
    assert job["metadata"] == {"job": "a"} and job["runtime_env"]["working_dir"] == "/code"
    assert job["runtime_env"]["env_vars"]["NCCL_DEBUG"] == "INFO"
    assert job["runtime_env"]["env_vars"][ENV_DIR] == str(cfg.rollout_dir)
    assert reward_env_vars({"MENTOR_A": "1", "B": "2"}, {"MENTOR_A": "3"}) == {"MENTOR_A": "3"}
    with pytest.raises(ConfigError, match=f"{RAY_JOB_CONFIG_ENV} is set but is not a JSON job config"):
        ray_job_config_env({}, "not json")


def test_unwritable_local_dir_is_refused(tmp_path):
    import pytest

    from mentor.training.rollout_log import RolloutDirUnreachable, check_rollout_reach

    (tmp_path / "file").write_text("x")
    with pytest.raises(RolloutDirUnreachable, match=r"rollout log dir .*/file/log: cannot write there"):
        check_rollout_reach(None, tmp_path / "file" / "log")
    assert check_rollout_reach(None, tmp_path / "ok" / "log") and not list((tmp_path / "ok" / "log").iterdir())
