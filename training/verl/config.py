"""A verl round's config (`round.yaml` with ``kind: verl``): mentor's fields, the keys mentor sets itself
(`OWNED`, refused in ``overrides``), mentor's defaults on top of verl's (`DEFAULTS`), and the overrides
checked against Hydra's key syntax and verl's own config types (where verl is installed)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from mentor.pipeline.errors import ConfigError
from mentor.pipeline.yaml_io import read_yaml_mapping
from mentor.training.field_types import check_override_types
from mentor.training.launcher import RewardFile, RoundConfig, parse_round_config
from mentor.training.rollout_log import REWARD_ENV_PREFIX
from mentor.training.verl.hydra import hydra_value, packaged_config, typed_overrides

ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"

# verl keys mentor sets from the round; `overrides` may not set them (the field to use instead).
OWNED = {
    "data.train_files": "prompts",
    "actor_rollout_ref.model.path": "base_model / actor_model",
    "actor_rollout_ref.rollout.n": "n_samples_per_prompt",
    "algorithm.adv_estimator": "adv_estimator",
    "reward.custom_reward_function.path": "reward_file",
    "reward.custom_reward_function.name": "reward_function",
    "trainer.n_gpus_per_node": "n_gpus_per_node",
    "trainer.nnodes": "nnodes",
    "trainer.default_local_dir": "round_dir / train_dir (checkpoints go to <train>/ckpt)",
}
# mentor's defaults on top of verl's (any of them can be overridden).
DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
    # One epoch: every row of the round once (verl.batches makes whole batches, so its drop_last skips none).
    "trainer.total_epochs": 1,
    "trainer.save_freq": 20,  # > 0: verl then also saves the last step, which the merger turns into the round's model
    "trainer.max_actor_ckpt_to_keep": 1,
    "trainer.val_before_train": False,
    "trainer.logger": ["console"],
    "trainer.project_name": "mentor",
}
_KEY = re.compile(r"(\+\+|\+|~)?([A-Za-z_][\w\-]*(?:\.[\w\-@]+)*)")


class VerlTrainConfig(RoundConfig):
    """One verl GRPO round (`round.yaml` with ``kind: verl``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["verl"] = Field("verl", description="Selects the verl trainer in a round.yaml (workflows give it as trainer.kind).")
    n_samples_per_prompt: int = Field(4, ge=2, description="GRPO group size (actor_rollout_ref.rollout.n).")
    adv_estimator: str = Field("grpo", description="algorithm.adv_estimator (grpo; verl also has rloo, reinforce_plus_plus, ...).")
    n_gpus_per_node: int = Field(1, ge=1, description="trainer.n_gpus_per_node (verl's default is 8).")
    nnodes: int = Field(1, ge=1, description="trainer.nnodes.")
    reward_file: RewardFile | None = Field(None, description="reward.custom_reward_function.path (default: mentor's verl/reward.py).")
    reward_function: str = Field("compute_score", description="reward.custom_reward_function.name.")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other verl setting as a dotted key, e.g. {'data.train_batch_size': 256, "
        "'actor_rollout_ref.actor.optim.lr': 1e-6}; '+key' adds a key verl's config lacks, '~key' removes one (value null).",
    )
    merge_model: bool = Field(True, description="Merge the last checkpoint into <train>/model with verl's model merger (the next round's model).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the trainer (MENTOR_* ones reach the reward workers too).")
    preflight: bool = Field(True, description="Before launch, refuse a round the GPUs cannot place or whose rollout log dir the Ray workers cannot reach.")

    @property
    def ckpt_path(self) -> Path:
        return self.train_path / "ckpt"



def parse_config(data: dict[str, Any], where: str = "round config") -> VerlTrainConfig:
    """Validate mentor's fields and the override keys; `ConfigError` names the field."""
    cfg = parse_round_config(VerlTrainConfig, data, where)
    try:
        given = user_overrides(cfg.overrides)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check_override_values(cfg.overrides, given, where)
    save_freq = next((v for k, v in cfg.overrides.items() if k.lstrip("+~") == "trainer.save_freq"), None)
    if cfg.merge_model and save_freq is not None and not _positive(save_freq):
        raise ConfigError(f"{where}: overrides.trainer.save_freq {save_freq!r}: must be > 0: verl saves the last step only "
                          "then, and the round's model is merged from it (or set merge_model: false)")
    return cfg


def check_override_values(overrides: dict[str, Any], given: list[str], where: str) -> None:
    """The overrides' values against the types of verl's own config (its packaged defaults), where verl and
    Hydra are installed here; without them the dry run says the config check did not run."""
    if not given or importlib.util.find_spec("verl") is None or importlib.util.find_spec("hydra") is None:
        return
    typed = typed_overrides(given)
    plain = {str(k).lstrip("+~"): v for k, v in overrides.items()}
    check_override_types(plain, packaged_config(), typed, where)


def _positive(value: Any) -> bool:
    try:
        return int(str(value)) > 0
    except ValueError:
        return True  # not a number: verl's own config check says what is wrong with it


def load_config(path: str | os.PathLike) -> VerlTrainConfig:
    path = Path(path)
    return parse_config(read_yaml_mapping(path, "round settings"), str(path))


def user_overrides(overrides: dict[str, Any]) -> list[str]:
    out = []
    for key, value in overrides.items():
        m = _KEY.fullmatch(str(key))
        if not m:
            raise ConfigError(f"overrides: {key!r} is not a dotted verl key (e.g. data.train_batch_size, +new.key, ~old.key)")
        prefix, name = m.group(1) or "", m.group(2)
        if name in OWNED:
            raise ConfigError(f"overrides: {name} is set by mentor; use {OWNED[name]} instead")
        if name.startswith(f"{ENV_VARS_KEY}.{REWARD_ENV_PREFIX}"):
            raise ConfigError(f"overrides: {name}: set it under env instead (MENTOR_* variables reach the Ray workers "
                              f"through the job's runtime env, and Ray refuses a variable set in both)")
        if prefix == "~":
            out.append(f"~{name}" if value is None else f"~{name}={hydra_value(value)}")
        else:
            out.append(f"{prefix}{name}={hydra_value(value)}")
    return out


__all__ = ["DEFAULTS", "ENV_VARS_KEY", "OWNED", "VerlTrainConfig", "check_override_values", "load_config", "parse_config", "user_overrides"]
