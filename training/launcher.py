"""What every trainer's round shares: the `RoundConfig` base, the `Launcher` protocol, and the registry.

A trainer kind (OpenRLHF, verl, TRL, or a plugin's) is one folder under ``training/``
whose ``launcher.py`` declares ``LAUNCHER``: a `Launcher` with its round config (a
`RoundConfig` with the trainer's own fields), and four steps that `mentor train` and the
workflow runner call the same way for every kind::

    launcher = get_launcher(kind)                  # any of trainer_kinds()
    cfg = launcher.parse(data, where)              # its Config, errors naming the file and key
    cfg = cfg.for_round(r, prompts=..., ...)       # what a workflow decides per round
    launcher.command(cfg), launcher.env(cfg)       # the exact trainer command and its variables
    launcher.check(cfg)                            # every refusal before launch, as text for --dry-run
    launcher.run_round(cfg)                        # launch, wait, record outcome.json

Besides the steps a launcher declares what the rest of mentor asks of a trainer (`LauncherBase`
gives the defaults): the ``ingest --format`` of its reward's logs (``log_format``), log formats of its
own that ``mentor ingest`` reads (``log_formats``, `mentor.pipeline.log_rows.LogFormat`), the reward
entry `mentor doctor` loads with the trainer's Python (``reward``), what doctor checks on a node for it
(``node_checks``), its live-hints hook (``live``, `mentor.training.live_hints`), whether it reads text prompts
(``text_prompts_refused``), where it takes chat-template variables (``template_kwargs_key``,
`LauncherBase.template_kwargs`), and its workflow section (``section``; by default
``{kind, config}``). The kinds are the folders (`mentor.pipeline.plugins`, point ``trainers``,
``MENTOR_PLUGIN_PATH`` included): nothing lists them by hand.

Every round records ``<round>/train/outcome.json`` (`outcome_record`); round k starts
from round k-1's final model unless ``actor_model`` is set (`previous_final_model`).
"""

from __future__ import annotations

import ast
import os
import shlex
import string
import sys
import time
from collections import deque
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError, MentorError, config_error
from mentor.pipeline.io import read_json, write_json_atomic
from mentor.pipeline.log_rows import LogFormat
from mentor.pipeline.models import resolve_model
from mentor.pipeline.schemas import RECORDS_FORMAT
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
    if "live_hints" in data and "live_hints" not in cls.model_fields:  # the trainers whose launcher declares a live hook
        kinds = " or ".join(f"kind: {k}" for k in trainer_kinds() if get_launcher(k).live)
        raise ConfigError(f"{where}: live_hints: this trainer has no live hints (its launcher declares no live hook) yet: "
                          f"remove live_hints, or train with {kinds}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, where) from exc


# --------------------------------------------------------------------------- the protocol


class Launcher(Protocol):
    """One trainer kind. Its round config is a `RoundConfig`; ``summary`` names the outcome keys a workflow
    records in its done marker; the rest is what `LauncherBase` describes (and gives defaults for)."""

    kind: ClassVar[str]
    Config: ClassVar[type[RoundConfig]]
    summary: ClassVar[tuple[str, ...]]
    name: str
    log_format: ClassVar[str]
    log_formats: ClassVar[tuple[LogFormat, ...]]
    reward: ClassVar["RewardEntry | None"]
    text_prompts_refused: ClassVar[str | None]
    template_kwargs_key: ClassVar[str | None]
    live: ClassVar[str | None]

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> RoundConfig:
        """The round config from `data`; `strict=False` (a workflow file being loaded) skips checks that need the
        trainer's package in mentor's own environment."""

    def command(self, cfg: RoundConfig) -> list[str]: ...

    def env(self, cfg: RoundConfig) -> dict[str, str]: ...

    def check(self, cfg: RoundConfig) -> str: ...

    def run_round(self, cfg: RoundConfig) -> dict[str, Any]: ...

    def template_kwargs(self, config: Mapping[str, Any]) -> Any: ...

    def workflow_section(self) -> type[BaseModel]: ...

    def run_section(self, section: Any, round_: int, placeholders: dict[str, str], out_dir: Path) -> tuple[int, str | None]: ...


# A reward entry `mentor doctor` loads with the trainer's Python: (file or module, attribute, "file" | "module").
RewardEntry = tuple[str, str, Literal["file", "module"]]


# What a workflow round hands a trainer section it runs itself (`LauncherBase.run_section`), by name.
ROUND_PLACEHOLDERS = ("prompts", "rollout_dir", "round", "run_dir", "model", "prev_model")


def check_placeholders(text: str, allowed: tuple[str, ...]) -> str:
    """`text` if every ``{name}`` in it is one of `allowed` (``{{``/``}}`` for literal braces); else a ValueError
    that names the bad placeholder and the fix (checked when the workflow is loaded, not when the round runs)."""
    fix = f"use {', '.join('{' + a + '}' for a in allowed)}, or write {{{{ and }}}} for a literal brace"
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{text!r}: malformed placeholder ({exc}); {fix}") from None
    for name, spec, conv in fields:
        if name not in allowed or spec or conv:
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"{text!r}: unknown placeholder {shown}; {fix}")
    return text


class LaunchedSection(BaseModel):
    """A workflow's ``trainer`` section for a launched kind: ``{kind, config}``, ``config`` its round config."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    config: dict[str, Any] = Field(default_factory=dict, description="The `mentor train` round config of this kind "
                                   "(its launcher's Config; round, round_dir and prompts are the workflow's).")


class LauncherBase:
    """What a launcher declares beyond the four steps, with the defaults a new trainer starts from.

    A subclass sets ``kind`` (its folder's name) and ``Config``, and writes `command` and `run_round`;
    the rest is optional."""

    kind: ClassVar[str]
    Config: ClassVar[type[RoundConfig]]
    title: ClassVar[str] = ""  # how messages name it ("OpenRLHF 0.11.2"); default: the kind
    summary: ClassVar[tuple[str, ...]] = ("exit_code", "final_model", "log_file", "duration_s")
    log_format: ClassVar[str] = RECORDS_FORMAT  # `mentor ingest --format` of what its reward logs (mentor's JSONL records)
    log_formats: ClassVar[tuple[LogFormat, ...]] = ()  # formats of its own logs `mentor ingest` reads (e.g. verl's dumps)
    reward: ClassVar[RewardEntry | None] = None  # what `mentor doctor` loads with the trainer's Python
    text_prompts_refused: ClassVar[str | None] = None  # why it cannot read text prompts (None: it reads them)
    template_kwargs_key: ClassVar[str | None] = None  # where its config takes chat-template variables (None: nowhere)
    section: ClassVar[type[BaseModel] | None] = None  # its workflow section (None: `LaunchedSection` with its kind)
    live: ClassVar[str | None] = None  # its live-hints hook's module (None: no live hints; `mentor.training.live_hints`)
    round_yaml_default: ClassVar[bool] = False  # a round.yaml without `kind` is its (one trainer's: `default_kind`)
    response_limit_key: ClassVar[str | None] = None  # where its round config sets the response limit (in mine's advice)
    # What `mentor setup-cpu --openrlhf` installs for its contract tests, with --no-deps (its own pins are for GPUs)
    setup_pins: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return self.title or self.kind

    def node_checks(self) -> dict[str, Callable[[], tuple[str, str | None]]]:
        """What ``mentor doctor`` checks on a node for its rounds: check name -> a function returning
        ``(detail, fix)`` (a fix: a problem; None: ok). Default: nothing."""
        return {}

    def parse(self, data: dict[str, Any], where: str = "round config", strict: bool = True) -> RoundConfig:
        if "kind" not in self.Config.model_fields:  # the key that picked this launcher (a round.yaml's)
            data = {k: v for k, v in data.items() if k != "kind"}
        return parse_round_config(self.Config, data, where)

    def command(self, cfg: RoundConfig) -> list[str]:
        raise NotImplementedError

    def env(self, cfg: RoundConfig) -> dict[str, str]:
        return {}

    def check(self, cfg: RoundConfig) -> str:
        return shlex.join(self.command(cfg))

    def run_round(self, cfg: RoundConfig) -> dict[str, Any]:
        raise NotImplementedError

    def template_kwargs(self, config: Mapping[str, Any]) -> Any:
        """The chat-template variables its round config passes (as given: a mapping or JSON text; None: none)."""
        value: Any = config
        for part in (self.template_kwargs_key or "").split(".") if self.template_kwargs_key else []:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value if self.template_kwargs_key else None

    @classmethod
    def workflow_section(cls) -> type[BaseModel]:
        """Its model of a workflow's ``trainer`` section (``kind`` a literal: one arm of the train stage's union)."""
        if cls.section is not None:
            return cls.section
        return create_model(f"{cls.kind.title().replace('_', '')}Trainer", __base__=LaunchedSection,
                            __doc__=f"One {cls.title or cls.kind} round per mentor round (`mentor train` with kind: {cls.kind}).",
                            kind=(Literal[cls.kind], ...))  # type: ignore[valid-type]

    def run_section(self, section: Any, round_: int, placeholders: dict[str, str], out_dir: Path) -> tuple[int, str | None]:
        """A section mentor does not launch as a round (no ``config``, e.g. verl's own command): run it, return
        (exit code, final model)."""
        raise ConfigError(f"trainer kind {self.kind}: give trainer.config (the round config)")


def trainer_kinds() -> list[str]:
    """The trainer kinds: the folders of `mentor.training` with a ``launcher.py``, then ``MENTOR_PLUGIN_PATH``'s."""
    return plugins.names("trainers")


def response_limit_settings() -> str:
    """Where each trainer's round config sets the response limit, for advice ("TRL max_completion_length, ...").

    Read from the launcher modules' top-level ``TITLE`` and ``RESPONSE_LIMIT_KEY`` without importing them (loading
    the three launchers cost `mentor mine` 0.1 s of its 2 s on 2M rows); a launcher that declares them only on its
    class (`LauncherBase.title`, `response_limit_key`) is imported."""
    parts = []
    for kind in trainer_kinds():
        title, key = (_literal(plugins.declared("trainers", kind, name)) for name in ("TITLE", "RESPONSE_LIMIT_KEY"))
        if not isinstance(key, str):
            launcher = get_launcher(kind)
            title, key = launcher.name, launcher.response_limit_key
        if key:
            parts.append(f"{title or kind} {key}")
    return ", ".join(parts)


def _literal(node: ast.expr | None) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None


def get_launcher(kind: Any) -> Launcher:
    """The ``LAUNCHER`` of trainer `kind` (imported on first use: a round of one kind never imports another's code)."""
    kinds = trainer_kinds()
    if not isinstance(kind, str) or kind not in kinds:
        raise ConfigError(f"trainer kind {kind!r}: mentor launches {', '.join(kinds)}")
    return plugins.load("trainers", kind).LAUNCHER


def load_round(path: str | os.PathLike) -> tuple[Launcher, RoundConfig]:
    """A `round.yaml`: its launcher (``kind``; left out: `default_kind`) and its config; errors name the file."""
    data = read_yaml_mapping(Path(path), "round settings")
    kind = default_kind() if data.get("kind") is None else data["kind"]
    kinds = trainer_kinds()
    if not isinstance(kind, str) or kind not in kinds:
        default = default_kind()
        raise ConfigError(f"{path}: kind {kind!r}: give one of {', '.join(kinds)} (a single name"
                          + (f"; leave it out for {default})" if default else ")"))
    launcher = get_launcher(kind)
    return launcher, launcher.parse(data, str(path))


def default_kind() -> str | None:
    """The kind of a round.yaml without ``kind``: the trainer whose launcher declares ``round_yaml_default`` (its
    round.yaml files predate the others), None when none does."""
    return next((k for k in trainer_kinds() if get_launcher(k).round_yaml_default), None)


__all__ = ["LaunchedSection", "Launcher", "LauncherBase", "ModelRef", "OUTCOME", "RewardEntry", "RewardFile",
           "ROUND_PLACEHOLDERS", "RoundConfig", "TrainError", "check_placeholders", "default_kind", "get_launcher", "response_limit_settings", "load_round", "local_model_or_name", "log_tail",
           "prompt_sources_ok", "reward_file_path", "outcome_record", "parse_round_config", "previous_final_model",
           "trainer_kinds"]
