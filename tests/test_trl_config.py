"""`trainer: {kind: trl}` and `mentor train` with kind: trl: settings checked against TRL's own GRPOConfig.

Fast (no model is loaded, nothing trains); needs the trl package (`pip install 'mentor[trl]'`).
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("trl")

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError, DataError  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.trl.launcher import (  # noqa: E402
    parse_config,
    resolve_grpo,
    run_round,
    select_prompts,
)
from mentor.workflows.config import load_workflow, validate_workflow  # noqa: E402


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    """round-001 with `mentor build`'s unhinted GSM8K prompts (1,319 rows)."""
    d = tmp_path_factory.mktemp("run") / "round-001"
    BUILD({}, BuildConfig(base="gsm8k", round=1), d / "prompts")
    return d


def _write(tmp_path, data) -> str:
    p = tmp_path / "round.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_unknown_grpo_field_is_an_error_naming_it(tmp_path, round_dir):
    with pytest.raises(ConfigError, match=r"lerning_rate: not a mentor trl setting nor a field of TRL .*GRPOConfig \(did you mean learning_rate\?\)"):
        parse_config({"round_dir": str(round_dir), "lerning_rate": 1e-5})
    with pytest.raises(ConfigError, match="output_dir is set by mentor"):
        parse_config({"round_dir": str(round_dir), "output_dir": "/tmp/x"})
    with pytest.raises(ConfigError, match="num_generations: Input should be greater than or equal to 2"):
        parse_config({"round_dir": str(round_dir), "num_generations": 1})
    # The CLI: exit 2, one line naming the file and the field, no traceback.
    res = CliRunner().invoke(cli, ["train", "--config", _write(tmp_path, {"kind": "trl", "round_dir": str(round_dir), "max_step": 2})])
    assert res.exit_code == 2, res.output
    assert "round.yaml: max_step: not a mentor trl setting" in res.output and "max_steps" in res.output
    assert "Traceback" not in res.output


def test_trl_rejections_surface_as_config_errors(round_dir):
    # TRL's GRPOConfig itself refuses a generation batch that holds no whole group.
    cfg = parse_config({"round_dir": str(round_dir), "per_device_train_batch_size": 3, "num_generations": 4})
    with pytest.raises(ConfigError, match="TRL's GRPOConfig rejects the settings: .*divisible"):
        resolve_grpo(cfg)
    with pytest.raises(ConfigError, match="TRL's GRPOConfig rejects"):
        run_round(cfg)


def test_cpu_defaults_and_user_fields(round_dir):
    cfg = parse_config({"round_dir": str(round_dir), "max_steps": 3, "learning_rate": 2e-6, "num_generations": 2,
                        "per_device_train_batch_size": 2})
    args = resolve_grpo(cfg)
    assert (args.num_generations, args.max_steps, args.learning_rate, args.num_train_epochs) == (2, 3, 2e-6, 1)
    assert args.use_cpu and args.bf16 is False and args.gradient_checkpointing is False
    assert args.report_to == []  # "none": no wandb/tensorboard reporting
    assert args.output_dir == str(round_dir.resolve() / "train" / "ckpt")
    # A field the user sets wins over mentor's CPU default.
    assert resolve_grpo(parse_config({"round_dir": str(round_dir), "gradient_checkpointing": True})).gradient_checkpointing is True


def test_dry_run_prints_the_resolved_grpo_config(tmp_path, round_dir):
    path = _write(tmp_path, {"kind": "trl", "round": 0, "round_dir": str(round_dir), "limit": 3, "max_completion_length": 64,
                             "per_device_train_batch_size": 4})
    res = CliRunner().invoke(cli, ["train", "--config", path, "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "# prompts: 3 prompt row(s)" in out
    assert "export MENTOR_ROLLOUT_DIR=" in out and "export OMP_NUM_THREADS=1" in out
    assert "-m mentor.training.trl.train" in out
    resolved = json.loads(out.split("# GRPOConfig as TRL resolved it (every field)\n", 1)[1])
    assert resolved["max_completion_length"] == 64 and resolved["num_generations"] == 4
    assert resolved["bf16"] is False and resolved["use_cpu"] is True and resolved["gradient_checkpointing"] is False
    assert len(resolved) > 150  # every field, not only the ones set
    assert not (round_dir / "train").exists()  # a dry run writes nothing


def test_select_hinted_on_unhinted_prompts_is_a_data_error(round_dir):
    cfg = parse_config({"round_dir": str(round_dir), "select": "hinted"})
    with pytest.raises(DataError, match="no rows left with select=hinted"):
        select_prompts(cfg)
    assert select_prompts(parse_config({"round_dir": str(round_dir), "select": "unhinted", "limit": 5})).height == 5


def test_workflow_trainer_kind_trl():
    wf = load_workflow("gsm8k-loop-cpu")
    assert wf.trainer.kind == "trl" and wf.rounds == 2
    assert parse_config(wf.trainer.config).select == "hinted"
    base = {"name": "t", "base": "gsm8k", "trainer": {"kind": "trl", "config": {"max_stepz": 1}}}
    with pytest.raises(ConfigError, match=r"workflow: trainer.config: max_stepz: not a mentor trl setting.*did you mean max_steps"):
        validate_workflow(base)
    with pytest.raises(ConfigError, match="trainer.config.kind: set by trainer.kind"):
        validate_workflow(base | {"trainer": {"kind": "trl", "config": {"kind": "trl"}}})
    with pytest.raises(ConfigError, match="trainer.config: limit: Input should be greater than or equal to 1"):
        validate_workflow(base | {"trainer": {"kind": "trl", "config": {"limit": 0}}})


def test_without_trl_the_error_says_how_to_install(round_dir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError, as when it is not installed
    with pytest.raises(ConfigError, match=r"trainer kind trl needs the trl package .*pip install 'mentor\[trl\]'"):
        parse_config({"round_dir": str(round_dir), "max_steps": 1})
    # A workflow file still loads (mentor's own fields checked), but `mentor run` stops before any stage.
    from mentor.workflows.runner import Runner

    wf = load_workflow("gsm8k-loop-cpu")
    with pytest.raises(ConfigError, match="needs the trl package"):
        Runner(wf, round_dir.parent / "no-trl-run").run()
    assert not (round_dir.parent / "no-trl-run").exists()
    with pytest.raises(ConfigError, match="limit: Input should be greater than or equal to 1"):
        validate_workflow({"name": "t", "base": "gsm8k", "trainer": {"kind": "trl", "config": {"limit": 0}}})


def test_several_processes_launch_through_accelerate(tmp_path, round_dir):
    from mentor.training.trl.launcher import build_command, check_with_accelerate

    path = _write(tmp_path, {"kind": "trl", "round_dir": str(round_dir), "num_processes": 4, "per_device_train_batch_size": 4})
    res = CliRunner().invoke(cli, ["train", "--config", path, "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    cmd = next(ln for ln in res.output.splitlines() if "mentor.training.trl.train" in ln).split()
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    # --cpu would make accelerate start one process whatever --num_processes says: torchrun (--multi_gpu) starts all.
    assert cmd[cmd.index("--num_processes") + 1] == "4" and "--multi_gpu" in cmd and "--cpu" not in cmd
    assert cmd[-3:-1] == ["-m", "mentor.training.trl.train"]
    assert "# processes: 4 (accelerate launch); GPUs: none (use_cpu)" in res.output
    one = parse_config({"round_dir": str(round_dir)})
    assert build_command(one)[1:3] == ["-m", "mentor.training.trl.train"]  # one process: no launcher
    # A config file picks the launcher itself (DeepSpeed, FSDP ...): passed through, no --multi_gpu added.
    (tmp_path / "zero2.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\n")
    ds = build_command(parse_config({"round_dir": str(round_dir), "num_processes": 8, "accelerate_config": str(tmp_path / "zero2.yaml")}))
    assert ds[ds.index("--config_file") + 1] == str(tmp_path / "zero2.yaml") and "--multi_gpu" not in ds
    # accelerate's own parser and checks, as one-line errors.
    for extra, said in ((({"num_proceses": 3}), "unrecognized arguments: --num_proceses"),
                        ({"use_deepspeed": True, "multi_gpu": True}, "You can only use one of"),
                        ({"mixed_precision": "fp17"}, "invalid choice: 'fp17'"),
                        ({"num_processes": 3}, "--num_processes is set by mentor; use num_processes")):
        with pytest.raises(ConfigError, match=said):
            check_with_accelerate(build_command(parse_config({"round_dir": str(round_dir), "num_processes": 2,
                                                               "accelerate_args": extra})))


def test_gpu_processes_are_checked_against_the_gpus(round_dir, monkeypatch):
    from mentor.training.gpus import GpuShortage

    monkeypatch.setenv("MENTOR_FAKE_GPUS", "2")
    cfg = parse_config({"round_dir": str(round_dir), "num_processes": 4, "use_cpu": False, "bf16": False})
    with pytest.raises(GpuShortage, match=r"needs 4 GPUs \(4 trainer processes\), this machine \(MENTOR_FAKE_GPUS=2\) has 2: set num_processes 2"):
        run_round(cfg)
    assert not (round_dir / "train").exists()  # refused before anything was written
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "4")
    from mentor.training.trl.launcher import check_gpus, gpu_demand, round_spec

    check_gpus(gpu_demand(cfg, round_spec(cfg)))  # 4 processes fit 4 GPUs


def test_a_prompt_and_completion_over_the_models_context_is_refused(tmp_path, round_dir, policy_model):
    """TRL 1.16 cuts no prompt: the round's longest prompt plus max_completion_length must fit the model's context
    (the embedded SmolLM2's max_position_embeddings, 8192), measured with its tokenizer, before anything starts."""
    base = {"kind": "trl", "round_dir": str(round_dir), "base_model": policy_model, "round": 0}
    out = CliRunner().invoke(cli, ["train", "--config", _write(tmp_path, base), "--dry-run"])
    assert out.exit_code == 0, out.output
    longest = int(next(ln for ln in out.output.splitlines() if ln.startswith("# longest prompt: ")).split()[3])
    assert 100 < longest < 400  # GSM8K prompts in SmolLM2's tokens
    too_long = base | {"max_completion_length": 8192 - longest + 1}
    res = CliRunner().invoke(cli, ["train", "--config", _write(tmp_path, too_long)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert (f"the round's longest prompt is {longest} tokens" in res.output and "it needs 8193 tokens of context" in res.output
            and "max_position_embeddings=8192" in res.output)
    assert not (round_dir / "train" / "train.log").exists()


def test_a_gpu_round_is_found_by_nvidia_smi_not_by_mentors_torch(round_dir, tmp_path, monkeypatch):
    """mentor's interpreter here has a CPU torch (a hint node's venv); the node has two GPUs (a stand-in
    nvidia-smi listing them, as `nvidia-smi --query-gpu=index` prints): the round trains on them."""
    from mentor.training.trl.launcher import grpo_kwargs

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    for var in ("MENTOR_FAKE_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    cfg = parse_config({"round_dir": str(round_dir)})
    assert "use_cpu" not in grpo_kwargs(cfg) and "bf16" not in grpo_kwargs(cfg)  # TRL's GPU defaults stand
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: a CPU round
    assert grpo_kwargs(cfg)["use_cpu"] is True
