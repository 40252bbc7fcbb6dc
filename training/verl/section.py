"""verl's workflow section: a round mentor builds from ``config`` (the launcher), or the user's own ``command``.

``trainer: {kind: verl, command: ...}`` runs the user's launch with the round's placeholders
(`ROUND_PLACEHOLDERS`), with ``MENTOR_ROLLOUT_DIR`` set (and handed to verl's Ray job config) so
mentor's verl reward function logs every rollout into the round's logs; ``model_out`` says where it
leaves the round's final model. Also here: why verl cannot read text prompts (`TEXT_WHY`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mentor.pipeline.errors import DataError
from mentor.pipeline.io import write_json_atomic
from mentor.training.launcher import OUTCOME, ROUND_PLACEHOLDERS, check_placeholders
from mentor.training.rollout_log import RAY_JOB_CONFIG_ENV, ray_job_config_env, reward_env_vars

TEXT_WHY = ("verl 0.9.1 renders every prompt from chat messages with add_generation_prompt=True (its agent loop's "
            "Continuous Token builder), so it cannot continue an answer opened with the hint")


class VerlTrainer(BaseModel):
    """A verl GRPO round per mentor round: built by mentor from `config` (`mentor train` with kind: verl), or a user command."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["verl"]
    config: dict[str, Any] | None = Field(
        None,
        description="mentor's verl round settings (training/verl/config.py VerlTrainConfig: base_model, n_samples_per_prompt, "
        "n_gpus_per_node, nnodes, overrides of any verl key, ...): mentor builds verl's main_ppo command and merges the model.",
    )
    command: list[str] | str | None = Field(
        None,
        description="Instead of config, a custom launch; placeholders {prompts} {rollout_dir} {round} {run_dir} {model} {prev_model}. "
        "mentor sets MENTOR_ROLLOUT_DIR so its verl reward function logs every rollout there.",
    )
    model_out: str | None = Field(None, description="With command: where it leaves the round's final model (placeholders allowed).")

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str | None) -> list[str] | str | None:
        if v is None:
            return v
        try:
            words = v if isinstance(v, list) else shlex.split(v)
        except ValueError as exc:  # an unclosed quote
            raise ValueError(f"{v!r}: not a command line ({exc}); close the quote, or give the command as a list") from None
        if not words or not words[0].strip():
            raise ValueError("empty: give the launch, e.g. python3 -m verl.trainer.main_ppo data.train_files={prompts} ...")
        for word in words:
            check_placeholders(word, ROUND_PLACEHOLDERS)
        return v

    @field_validator("model_out")
    @classmethod
    def _model_out(cls, v: str | None) -> str | None:
        return v if v is None else check_placeholders(v, ROUND_PLACEHOLDERS)

    @model_validator(mode="after")
    def _one_form(self) -> "VerlTrainer":
        if (self.config is None) == (self.command is None):
            raise ValueError("give either config (mentor builds verl's command) or command (your own launch), not both or neither")
        if self.config is not None and self.model_out is not None:
            raise ValueError("model_out is for command; with config the model is merged into the round's train/model")
        return self


def run_command(t: VerlTrainer, r: int, ph: dict[str, str], out_dir: Path) -> tuple[int, str | None]:
    """`trainer: {kind: verl, command: ...}`: the user's own verl command, with the round's placeholders `ph`."""
    cmd = [c.format(**ph) for c in (t.command if isinstance(t.command, list) else shlex.split(t.command or ""))]
    env = os.environ | {"MENTOR_ROLLOUT_DIR": ph["rollout_dir"], "MENTOR_ROUND": str(r)}
    # verl's ray.init() merges this job config: the reward workers on every node get the variables too.
    env |= ray_job_config_env(reward_env_vars(env), env.get(RAY_JOB_CONFIG_ENV))
    log_file = out_dir / "train.log"
    with open(log_file, "wb") as fh:
        rc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    final = t.model_out.format(**ph) if t.model_out else None
    write_json_atomic({"kind": "verl", "command": cmd, "exit_code": rc, "log": str(log_file), "final_model": final},
                      out_dir / OUTCOME)
    if rc != 0:
        tail = log_file.read_text(errors="replace")[-2000:]
        raise DataError(f"round {r}: the verl command exited with {rc}; see {log_file}; last lines:\n{tail}")
    return rc, final


__all__ = ["TEXT_WHY", "VerlTrainer", "run_command"]
