"""``lora:`` in a TRL round: peft's LoraConfig checked when the config is read, given to TRL's GRPOTrainer as
``peft_config``, and the round's final model the start model with the adapters merged (a whole model, as the next
round loads it). Needs trl and peft; the round runs one step of a tiny random Llama on CPU (seconds)."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("trl")
pytest.importorskip("peft")

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.pipeline.io import write_parquet_atomic  # noqa: E402
from mentor.stages.build import BUILD, BuildConfig  # noqa: E402
from mentor.training.trl.launcher import dry_run_text, parse_config  # noqa: E402

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def round_dir(tmp_path_factory):
    """round-001 with the first 4 of `mentor build`'s unhinted GSM8K prompts."""
    d = tmp_path_factory.mktemp("run") / "round-001"
    BUILD({}, BuildConfig(base="gsm8k", round=1), d / "built")
    write_parquet_atomic(pl.read_parquet(d / "built" / "*.parquet").head(4), d / "prompts" / "part-00000.parquet",
                         dataset="prompts")
    return d


def test_lora_settings_are_checked_against_peft(tmp_path, round_dir):
    cfg = parse_config({"round_dir": str(round_dir), "lora": LORA})
    assert cfg.lora == LORA and "lora" not in cfg.grpo_fields  # mentor's setting, not a GRPOConfig field
    assert parse_config({"round_dir": str(round_dir)}).lora is None  # full fine-tuning stays the default
    assert parse_config({"round_dir": str(round_dir), "lora": {}}).lora == {}  # peft's defaults
    with pytest.raises(ConfigError, match=r"lora\.rr: not a field of peft .*LoraConfig \(did you mean r\?\)"):
        parse_config({"round_dir": str(round_dir), "lora": {"rr": 4}})
    with pytest.raises(ConfigError, match=r"lora: r '16': must be int"):
        parse_config({"round_dir": str(round_dir), "lora": {"r": "16"}})
    with pytest.raises(ConfigError, match=r"lora\.r 0: must be >= 1"):
        parse_config({"round_dir": str(round_dir), "lora": {"r": 0}})
    with pytest.raises(ConfigError, match=r"lora\.task_type is set by mentor"):
        parse_config({"round_dir": str(round_dir), "lora": {"task_type": "SEQ_CLS"}})
    # The CLI: exit 2, one line naming the file and the key, no traceback.
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump({"kind": "trl", "round_dir": str(round_dir), "lora": {"lora_alpah": 16}}))
    res = CliRunner().invoke(cli, ["train", "--config", str(path)])
    assert res.exit_code == 2, res.output
    assert "round.yaml: lora.lora_alpah: not a field of peft" in res.output and "lora_alpha" in res.output
    assert "Traceback" not in res.output


def test_dry_run_names_the_adapters(round_dir):
    text = dry_run_text(parse_config({"round_dir": str(round_dir), "lora": LORA, "max_completion_length": 16}))
    assert '# lora: {"lora_alpha": 8, "lora_dropout": 0.0, "r": 4, "target_modules": ["q_proj", "v_proj"]}' in text
    assert "# lora: none (full fine-tuning)" in dry_run_text(parse_config({"round_dir": str(round_dir), "max_completion_length": 16}))


def test_mentor_train_with_lora_trains_adapters_and_saves_a_merged_model(trainable_llama, round_dir, tmp_path):
    from safetensors import safe_open

    run = tmp_path / "round-001"
    cfg = {"kind": "trl", "round": 1, "round_dir": str(run), "prompts": str(round_dir / "prompts"), "actor_model": trainable_llama,
           "lora": LORA, "max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2,
           "gradient_accumulation_steps": 2, "max_completion_length": 8, "save_strategy": "no", "logging_steps": 1}
    (tmp_path / "round.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "round.yaml")], catch_exceptions=False)
    train = run / "train"
    assert res.exit_code == 0, res.output + (train / "train.log").read_text()[-3000:]
    assert json.loads((train / "outcome.json").read_text())["steps"] == 1
    # GRPOTrainer wrapped the policy with these adapters: they were saved from its model.
    adapter = json.loads((train / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter["base_model_name_or_path"] == trainable_llama
    # The final model is a whole model, adapters merged: the start model's tensor names, no LoRA weights.
    model = train / "model"
    assert not (model / "adapter_config.json").exists() and (model / "tokenizer_config.json").is_file()

    def names(folder):
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as fh:
            return set(fh.keys())

    assert names(model) == names(trainable_llama) and not any("lora" in k for k in names(model))
    assert not list(train.glob(".*.tmp"))  # the temp folders were renamed into place
