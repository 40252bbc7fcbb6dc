"""`mentor train` runs a round, records its outcome, chains rounds, and reports a failing trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.errors import ConfigError
from mentor.training.launcher import TrainError
from mentor.training.openrlhf.launcher import TrainConfig, build_command, run_round

from fake_trainers import fake_trainer

# Stands in for `python -m openrlhf.cli.train_ppo_ray`: writes the final model
# folder, notes where the reward log points, and exits with $FAKE_EXIT.
FAKE = """import json
argv = sys.argv[1:]
assert argv[:2] == ["-m", "openrlhf.cli.train_ppo_ray"], argv
out = argv[argv.index("--ckpt.output_dir") + 1]
code = int(os.environ.get("FAKE_EXIT", "0"))
print("step 1/1 loss=0.1")
if code == 0:
    os.makedirs(out, exist_ok=True)
    json.dump({"rollout_dir": os.environ["MENTOR_ROLLOUT_DIR"], "argv": argv}, open(os.path.join(out, "seen.json"), "w"))
else:
    print("Traceback (most recent call last):\\nRuntimeError: CUDA out of memory", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture(autouse=True)
def _three_gpus(monkeypatch):
    """The default round (1 actor + 1 reference + 1 vLLM GPU) fits; no Ray cluster is looked for."""
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "3")
    monkeypatch.setenv("RAY_ADDRESS", "local")


@pytest.fixture()
def fake_python(tmp_path) -> str:
    return fake_trainer(tmp_path / "fake-python", FAKE)


@pytest.fixture()
def base_model(policy_model) -> str:
    return policy_model


@pytest.fixture()
def prompts(gsm8k_prompts) -> str:
    return gsm8k_prompts


def _config(tmp_path: Path, fake_python: str, round_: int, base_model: str = "base/model", prompts: str | None = None,
            **kw) -> Path:
    conf = {"round": round_, "round_dir": str(tmp_path / "run" / f"round-{round_:03d}"), "base_model": base_model,
            "python": fake_python, **({"prompts": prompts} if prompts else {}), **kw}
    path = tmp_path / f"round-{round_}.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def test_rounds_chain_through_outcomes(tmp_path, fake_python, base_model, prompts):
    res = CliRunner().invoke(cli, ["train", "--config", str(_config(tmp_path, fake_python, 0, base_model, prompts))],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    r0 = tmp_path / "run" / "round-000" / "train"
    outcome = json.loads((r0 / "outcome.json").read_text())
    assert outcome["exit_code"] == 0 and outcome["final_model"] == str(r0 / "model")
    assert outcome["actor_model"] == base_model and outcome["longest_prompt"] > 100
    seen = json.loads((r0 / "model" / "seen.json").read_text())
    assert seen["rollout_dir"] == str(tmp_path / "run" / "round-000" / "rollouts" / "log")
    assert "step 1/1" in (r0 / "train.log").read_text()

    # Round 1 starts from round 0's final model, with a fresh checkpoint dir.
    res = CliRunner().invoke(cli, ["train", "--config", str(_config(tmp_path, fake_python, 1, prompts=prompts)), "--dry-run"])
    assert res.exit_code == 0
    assert f"--actor.model_name_or_path {r0 / 'model'}" in res.output
    assert "round-001/train/ckpt" in res.output and "round-000/train/ckpt" not in res.output


def test_round_without_previous_model_is_a_clear_error(tmp_path, fake_python):
    res = CliRunner().invoke(cli, ["train", "--config", str(_config(tmp_path, fake_python, 2)), "--dry-run"])
    assert res.exit_code == 2
    assert "round-001/train/outcome.json does not exist" in res.output


def test_failing_trainer_reports_log_tail(tmp_path, fake_python, monkeypatch, base_model, prompts):
    monkeypatch.setenv("FAKE_EXIT", "3")
    cfg = TrainConfig(**yaml.safe_load(_config(tmp_path, fake_python, 0, base_model, prompts).read_text()))
    with pytest.raises(TrainError) as err:
        run_round(cfg)
    assert "exited with code 3" in str(err.value) and "CUDA out of memory" in str(err.value)
    outcome = json.loads((cfg.train_path / "outcome.json").read_text())
    assert outcome["exit_code"] == 3 and outcome["final_model"] is None
    res = CliRunner().invoke(cli, ["train", "--config", str(_config(tmp_path, fake_python, 0, base_model, prompts))])
    assert res.exit_code == 1 and "CUDA out of memory" in res.output


def test_config_errors(tmp_path, fake_python):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"round_dir": "x", "base_model": "m", "n_samples": 4}))
    res = CliRunner().invoke(cli, ["train", "--config", str(bad), "--dry-run"])
    assert res.exit_code == 2 and "bad.yaml: n_samples: unknown key" in res.output
    cfg = TrainConfig(round_dir="x", base_model="m", extra_args={"rollout.n_samples_per_prompt": 8})
    with pytest.raises(ConfigError, match="n_samples_per_prompt"):
        build_command(cfg)
    cfg = TrainConfig(round_dir=str(tmp_path), base_model="m", extra_args={"train.batch_size": 8, "ds.lora.target_modules": ["q_proj", "v_proj"], "vllm.enforce_eager": True, "ckpt.load_enable": False})
    cmd = build_command(cfg)
    assert cmd[-6:] == ["--train.batch_size", "8", "--ds.lora.target_modules", "q_proj", "v_proj", "--vllm.enforce_eager"]
    assert os.path.isabs(cmd[cmd.index("--data.prompt_dataset") + 1])


def test_prompts_over_openrlhfs_limit_raise_it_or_are_refused(tmp_path, fake_python, base_model):
    """OpenRLHF keeps only the last data.max_len - rollout.max_new_tokens tokens of a prompt. Long hinted prompts
    raise data.max_len above its 2048 default; a data.max_len set too small is refused with both numbers."""
    import polars as pl

    from mentor.data import bundled
    from mentor.stages.build import BUILD, BuildConfig
    from mentor.training.openrlhf.launcher import round_command
    from test_build import make_hints

    ids = pl.read_parquet(bundled("humaneval_problems.parquet"))["problem_id"].head(10).to_list()
    hints = make_hints([{"problem_id": i, "hint": "Check every branch of the input before you return. " * 150} for i in ids],
                       tmp_path / "hints.parquet")
    BUILD({}, BuildConfig(base="humaneval", hints=[str(hints)], round=1), tmp_path / "prompts")
    cfg = TrainConfig(round=0, round_dir=str(tmp_path / "round-000"), base_model=base_model, prompts=str(tmp_path / "prompts"),
                      python=fake_python)
    cmd, found = round_command(cfg, dry_run=True)
    assert found.tokens > 1100 and found.rows == 164
    from mentor.training.prompt_limits import prompt_room

    # The response limit is explicit (mentor's 4096, not OpenRLHF's max_len - prompt); max_len holds the longest prompt,
    # its margin and a whole response.
    assert cmd[cmd.index("--rollout.max_new_tokens") + 1] == "4096"
    assert cmd[cmd.index("--data.max_len") + 1] == str(prompt_room(found.tokens) + 4096) and prompt_room(found.tokens) > found.tokens
    small = cfg.model_copy(update={"extra_args": {"data.max_len": 2048, "rollout.max_new_tokens": 1024}})
    with pytest.raises(ConfigError, match=rf"longest prompt is {found.tokens} tokens .*data.max_len=2048 and "
                                          rf"rollout.max_new_tokens=1024 OpenRLHF keeps only the last 1024 tokens"):
        run_round(small)
    assert not (tmp_path / "round-000" / "train" / "train.log").exists()
