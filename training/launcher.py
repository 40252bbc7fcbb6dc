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


# What a weights file is called: a model setting names the folder that holds one, never the file.
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".pkl")


def local_model_or_name(value: str | None) -> str | None:
    """A model setting: a Hugging Face name (``ORG/NAME``, a CPU model name) as given; a path must be a folder.

    What looks like a path (absolute, ``./``, ``../``, ``~``, or more than one ``/``) cannot be a hub
    name, so a folder that is not there is refused now, not when the trainer starts. An empty text, a file
    that is there, or a name ending like a weights file (``model.safetensors``) is refused too: the trainers
    would read it as a hub name and fail far later (or, empty, mentor would train its embedded model).
    """
    if value is None:
        return value
    if not value.strip():
        raise ValueError("empty: give a model folder (with config.json) or a Hugging Face name ORG/NAME "
                         "(leave the key out for the embedded SmolLM2-135M-Instruct, where the trainer allows it)")
    path = Path(value).expanduser()
    looks_local = os.path.isabs(value) or value.startswith((".", "~")) or value.count("/") >= 2 or "\\" in value
    if path.exists() and not path.is_dir():
        raise ValueError("is a file, not a model folder (a local model is the folder with config.json and the weights; "
                         "a Hugging Face model is named ORG/NAME)")
    if value.lower().endswith(WEIGHTS_SUFFIXES):
        raise ValueError("names a weights file: give the folder that holds it (with config.json) or a Hugging Face "
                         "name ORG/NAME")
    if looks_local and not path.is_dir():
        raise ValueError("no such folder (a local model is a folder with config.json; a Hugging Face model is named ORG/NAME)")
    return value


def reward_file_path(value: str | None) -> str | None:
    """A reward file setting: an existing Python file (the trainer imports it), checked when the config is read."""
    if value is None:
        return value
    path = Path(value).expanduser()
    if not value.strip():
        raise ValueError("empty: give a .py file, or leave the key out for mentor's own reward")
    if path.is_dir():
        raise ValueError("is a folder, not a Python file: give the .py file that defines the reward function")
    if not path.is_file():
        raise ValueError("no such file: give the .py file that defines the reward function (or leave the key out for mentor's own)")
    if path.suffix != ".py":
        raise ValueError("not a .py file: the trainer imports the reward function from a Python file")
    return value


def prompt_sources_ok(value: str | None) -> str | None:
    """``prompts``: `mentor build` folders, Parquet shards or globs, comma-separated; a file that is there must be Parquet."""
    if value is None:
        return value
    parts = value.split(",")
    if not value.strip() or any(not p.strip() for p in parts):
        raise ValueError("empty: give `mentor build`'s output folder (or Parquet shards, comma-separated)")
    for part in parts:
        path = Path(part).expanduser()
        if path.is_file() and path.suffix != ".parquet":
            raise ValueError(f"{part} is not a Parquet shard: give `mentor build`'s output folder (part-*.parquet) "
                             "or its .parquet files")
    return value


# base_model / actor_model of every launcher's round config.
ModelRef = Annotated[str, AfterValidator(local_model_or_name)]
# reward_file of the OpenRLHF and verl round configs.
RewardFile = Annotated[str, AfterValidator(reward_file_path)]


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
    prompts: Annotated[str, AfterValidator(prompt_sources_ok)] | None = Field(
        None, description="Prompt shards from `mentor build`: folders, .parquet files or globs, comma-separated "
        "(default: <round_dir>/prompts).")
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
        if self.actor_model:  # a CPU model name, as base_model: the folder setup-cpu converted it into
            return resolve_model(self.actor_model)
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
    if "live_hints" in data and "live_hints" not in cls.model_fields:  # mentor.training.trl.live: TRL only so far
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
LAUNCHERS = {"openrlhf": "mentor.training.openrlhf.launcher", "verl": "mentor.training.verl.launcher",
             "trl": "mentor.training.trl.launcher"}


def get_launcher(kind: Any) -> Launcher:
    if not isinstance(kind, str) or kind not in LAUNCHERS:
        raise ConfigError(f"trainer kind {kind!r}: mentor launches {', '.join(LAUNCHERS)}")
    return importlib.import_module(LAUNCHERS[kind]).LAUNCHER


def load_round(path: str | os.PathLike) -> tuple[Launcher, RoundConfig]:
    """A `round.yaml`: its launcher (``kind``, default openrlhf) and its config; errors name the file."""
    data = read_yaml_mapping(Path(path), "round settings")
    kind = "openrlhf" if data.get("kind") is None else data["kind"]
    if not isinstance(kind, str) or kind not in LAUNCHERS:
        raise ConfigError(f"{path}: kind {kind!r}: give one of {', '.join(LAUNCHERS)} (a single name; "
                          "leave it out for openrlhf)")
    launcher = get_launcher(kind)
    return launcher, launcher.parse(data, str(path))


__all__ = ["LAUNCHERS", "Launcher", "ModelRef", "OUTCOME", "RewardFile", "RoundConfig", "TrainError", "get_launcher", "load_round",
           "local_model_or_name", "log_tail", "prompt_sources_ok", "reward_file_path", "outcome_record", "parse_round_config", "previous_final_model"]
