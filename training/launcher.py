"""What every trainer's round shares: the `RoundConfig` base, the `Launcher` protocol, and the registry.

A trainer kind (OpenRLHF, verl, TRL) is one `Launcher`: its round config (a
`RoundConfig` with the trainer's own fields), and four steps that `mentor train`
and the workflow runner call the same way for every kind::

    launcher = get_launcher(kind)                  # openrlhf | verl | trl
    cfg = launcher.parse(data, where)              # its Config, errors naming the file and key
    cfg = cfg.for_round(r, prompts=..., ...)       # what a workflow decides per round
    launcher.command(cfg), launcher.env(cfg)       # the exact trainer command and its variables
    launcher.check(cfg)                            # every refusal before launch, as text for --dry-run
    launcher.run_round(cfg)                        # launch, wait, record outcome.json

The launchers live in `openrlhf_launcher`, `verl_launcher` and `trl_launcher`; a new
trainer is one more module with a `LAUNCHER` and one line in `LAUNCHERS`.

Every round records ``<round>/train/outcome.json`` (`outcome_record`); round k starts
from round k-1's final model unless ``actor_model`` is set (`previous_final_model`).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from mentor.pipeline.errors import ConfigError, MentorError, config_error
from mentor.pipeline.io import read_json, write_json_atomic
from mentor.pipeline.models import resolve_model
from mentor.pipeline.yaml_io import read_yaml_mapping

OUTCOME = "outcome.json"


class TrainError(MentorError):
    """The trainer exited with an error (exit 1); the message carries the log's tail."""


def local_model_or_name(value: str | None) -> str | None:
    """A model setting: a Hugging Face name (``ORG/NAME``, a CPU model name) as given; a path must be a folder.

    What looks like a path (absolute, ``./``, ``../``, ``~``, or more than one ``/``) cannot be a hub
    name, so a folder that is not there is refused now, not when the trainer starts.
    """
    if not value:
        return value
    looks_local = os.path.isabs(value) or value.startswith((".", "~")) or value.count("/") >= 2 or "\\" in value
    if looks_local and not Path(value).expanduser().is_dir():
        what = "is a file, not a model folder" if Path(value).expanduser().exists() else "no such folder"
        raise ValueError(f"{what} (a local model is a folder with config.json; a Hugging Face model is named ORG/NAME)")
    return value


# base_model / actor_model of every launcher's round config.
ModelRef = Annotated[str, AfterValidator(local_model_or_name)]


class RoundConfig(BaseModel):
    """The fields of one round that every trainer kind has, and the folders derived from them.

    Paths are absolute once derived: Ray workers and the trainer's processes do not share the
    launcher's working directory.
    """

    model_config = ConfigDict(extra="forbid")

    round: int = Field(0, ge=0, description="Round number (0 = the first, trained from base_model).")
    round_dir: str | None = Field(None, description="The round's directory (runs/<name>/round-NNN); train/ is created inside.")
    train_dir: str | None = Field(None, description="Where the trainer's outputs go (default: <round_dir>/train).")
    base_model: ModelRef | None = Field(
        None, description="HF folder or name of the base policy (round 0's model); none = the embedded SmolLM2-135M-Instruct.")
    actor_model: ModelRef | None = Field(
        None, description="Start from this model instead of the previous round's final model (normally left unset).")
    previous_round_dir: str | None = Field(
        None, description="Previous round's directory (default: sibling round-<round-1:03d> of round_dir).")
    prompts: str | None = Field(None, description="Prompt shards from `mentor build` (default: <round_dir>/prompts).")
    rollout_log_dir: str | None = Field(
        None, description="Where the reward logs rollouts (MENTOR_ROLLOUT_DIR; default: <round_dir>/rollouts/log).")
    python: str = Field(default_factory=lambda: sys.executable, description="Python of the trainer's environment.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the trainer.")

    @property
    def round_path(self) -> Path:
        if self.round_dir:
            return Path(self.round_dir).resolve()
        if self.train_dir:
            return Path(self.train_dir).resolve().parent
        raise ConfigError("the round config needs round_dir (runs/<name>/round-NNN) or train_dir")

    @property
    def train_path(self) -> Path:
        return Path(self.train_dir).resolve() if self.train_dir else self.round_path / "train"

    @property
    def output_dir(self) -> Path:
        return self.train_path / "model"

    @property
    def log_file(self) -> Path:
        return self.train_path / "train.log"

    @property
    def rollout_dir(self) -> Path:
        return (Path(self.rollout_log_dir) if self.rollout_log_dir else self.round_path / "rollouts" / "log").resolve()

    @property
    def prompt_sources(self) -> list[str]:
        return self.prompts.split(",") if self.prompts else [str(self.round_path / "prompts")]

    def start_model(self, start_from_base: bool = False) -> str:
        """The model this round starts from: explicit, the base model (round 0, or no earlier round trained one),
        or the previous round's final model."""
        if self.actor_model:
            return self.actor_model
        if self.round == 0 or start_from_base:
            return resolve_model(self.base_model)
        return previous_final_model(self.round, self.round_path, self.previous_round_dir)

    def for_round(self, round_: int | None = None, prompts: str | os.PathLike | None = None,
                  round_dir: str | os.PathLike | None = None, train_dir: str | os.PathLike | None = None,
                  rollout_dir: str | os.PathLike | None = None, prev_model: str | None = None,
                  start_from_base: bool = False) -> "RoundConfig":
        """A copy with what a workflow runner decides per round. `prev_model`: the last trained model (used unless
        ``actor_model`` is set); `start_from_base`: no earlier round trained one, so this round starts from base_model."""
        upd: dict[str, Any] = {}
        for key, value in (("round", round_), ("prompts", prompts), ("round_dir", round_dir), ("train_dir", train_dir),
                           ("rollout_log_dir", rollout_dir)):
            if value is not None:
                upd[key] = value if key == "round" else str(value)
        if not self.actor_model:
            if prev_model and (round_ if round_ is not None else self.round) > 0:
                upd["actor_model"] = prev_model
            elif start_from_base:
                upd["actor_model"] = self.start_model(start_from_base=True)
        return self.model_copy(update=upd)


def previous_final_model(round_: int, round_path: Path, previous_round_dir: str | None) -> str:
    """Round ``round_ - 1``'s final model, from its train/outcome.json (a ConfigError when it has none)."""
    prev = Path(previous_round_dir) if previous_round_dir else round_path.parent / f"round-{round_ - 1:03d}"
    outcome = prev / "train" / OUTCOME
    if not outcome.is_file():
        raise ConfigError(
            f"round {round_} starts from round {round_ - 1}'s final model, but {outcome} does not exist; "
            "train that round first, set previous_round_dir, or set actor_model"
        )
    rec = read_json(outcome)
    if rec.get("exit_code") != 0 or not rec.get("final_model"):
        raise ConfigError(f"{outcome}: round {round_ - 1} did not finish (exit code {rec.get('exit_code')}); rerun it or set actor_model")
    return str(rec["final_model"])


def outcome_record(cfg: RoundConfig, code: int, final: Path | None, actor: str, cmd: list[str], env: dict[str, str],
                   started: float, **extra: Any) -> dict[str, Any]:
    """The round's outcome.json: what ran, from which model, and where the final model is (None on failure)."""
    return {
        "round": cfg.round,
        "exit_code": code,
        "ok": code == 0,
        "log_file": str(cfg.log_file),
        "final_model": str(final) if final else None,
        "actor_model": actor,
        "rollout_log_dir": str(cfg.rollout_dir),
        **extra,
        "command": cmd,
        "env": env,
        "started": started,
        "duration_s": round(time.time() - started, 3),
    }


def finish_round(cfg: RoundConfig, outcome: dict[str, Any], failed: str | None) -> dict[str, Any]:
    """Write the round's outcome.json (atomically, success or not); `failed` (what went wrong, e.g. "verl exited
    with code 1") raises `TrainError` with the log's last lines."""
    write_json_atomic(outcome, cfg.train_path / OUTCOME)
    if failed:
        raise TrainError(f"{failed} (round {cfg.round}); full log: {cfg.log_file}\n--- last lines ---\n{log_tail(cfg.log_file)}")
    return outcome


def log_tail(path: Path, n: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            return b"".join(deque(fh, maxlen=n)).decode("utf-8", "replace")
    except OSError:
        return ""


def parse_round_config(cls: type[RoundConfig], data: dict[str, Any], where: str) -> RoundConfig:
    """`cls` validated from `data`; `ConfigError` naming `where` and the field."""
    if "live_hints" in data and "live_hints" not in cls.model_fields:  # mentor.training.trl_live: TRL only so far
        raise ConfigError(f"{where}: live_hints: live hints run in TRL rounds only (kind: trl); OpenRLHF's agent executor "
                          "and verl's agent loop are not wired yet: remove live_hints, or train with kind: trl")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, where) from exc


# --------------------------------------------------------------------------- the protocol


class Launcher(Protocol):
    """One trainer kind. Its round config is a `RoundConfig`; ``summary`` names the outcome keys a workflow
    records in its done marker."""

    kind: ClassVar[str]
    Config: ClassVar[type[RoundConfig]]
    summary: ClassVar[tuple[str, ...]]

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> RoundConfig:
        """The round config from `data`; `strict=False` (a workflow file being loaded) skips checks that need the
        trainer's package in mentor's own environment."""

    def command(self, cfg: RoundConfig) -> list[str]: ...

    def env(self, cfg: RoundConfig) -> dict[str, str]: ...

    def check(self, cfg: RoundConfig) -> str: ...

    def run_round(self, cfg: RoundConfig) -> dict[str, Any]: ...


# kind -> module with LAUNCHER (imported on first use: a round of one kind never imports another's trainer code)
LAUNCHERS = {"openrlhf": "mentor.training.openrlhf_launcher", "verl": "mentor.training.verl_launcher",
             "trl": "mentor.training.trl_launcher"}


def get_launcher(kind: str) -> Launcher:
    if kind not in LAUNCHERS:
        raise ConfigError(f"trainer kind {kind!r}: mentor launches {', '.join(LAUNCHERS)}")
    return importlib.import_module(LAUNCHERS[kind]).LAUNCHER


def load_round(path: str | os.PathLike) -> tuple[Launcher, RoundConfig]:
    """A `round.yaml`: its launcher (``kind``, default openrlhf) and its config; errors name the file."""
    data = read_yaml_mapping(Path(path), "round settings")
    launcher = get_launcher(data.get("kind") or "openrlhf")
    return launcher, launcher.parse(data, str(path))


__all__ = ["LAUNCHERS", "Launcher", "ModelRef", "OUTCOME", "RoundConfig", "TrainError", "get_launcher", "load_round",
           "local_model_or_name", "log_tail", "outcome_record", "parse_round_config", "previous_final_model"]
