"""The train stage: how one round's rollouts come to be, whichever trainer makes them.

The workflow's ``trainer`` section is this stage's config (`Trainer`, one model per
kind), and each kind is one branch of `TrainStage.run`:

- a trainer (a folder of ``training/`` with a launcher, `mentor.training.launcher.trainer_kinds`)
  with ``config``: one GRPO round of the trainer (its `Launcher`, the same four steps for every
  kind), its reward function logging every rollout into ``<train>/logs``; a trainer's section may
  take other forms it runs itself (`LauncherBase.run_section`, e.g. a user's own launch command);
- ``offline``: no training; the policy answers the round's prompts (`mentor rollout`);
- ``external``: a trainer mentor does not launch; wait until the round's logs are complete;
- no trainer, ``initial_rollouts``: existing logs stand in for round 0 (nothing runs).

``offline`` and ``external`` are this stage's own kinds (`OwnKind`), not trainers: each declares what
the rest of a workflow asks of a trainer section (the policy mentor samples, the seeds of its rounds,
the chat-template variables, text prompts, the format and files of its logs), as a trainer's launcher
does for its kind; the functions below (`section_policy`, `check_section`, `section_model`,
`section_template_kwargs`, `section_reads_text`, `section_logs`, ...) answer for any section, so the
workflow config, the runner and the ingest stage never name a kind.

The stage writes into ``round-NNN/train`` directly (``staged`` False): a trainer's own
checkpoints are its resume. Before any trainer starts, every engine an earlier stage
left (here or on the dask workers) is released: the GPUs' memory is the trainer's.
stats.json records the kind, the final model or the files; ``outcome.json`` (the
launchers') what ran.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.backends import kind as backend_kind
from mentor.pipeline.inputs import glob_files
from mentor.pipeline.io import read_json
from mentor.pipeline.llm import BackendSettings, release_engines
from mentor.pipeline.outdir import Owns
from mentor.pipeline.schemas import RECORDS_FORMAT
from mentor.pipeline.stage import Context, Round, RoundJob, Source, Stage, Stats, StatsLayout
from mentor.stages.hint.live import hint_config
from mentor.stages.rollout import ROLLOUT, SEED_MAX, RolloutConfig
from mentor.training.launcher import OUTCOME, check_placeholders, get_launcher, trainer_kinds
from mentor.training.prompt_format import kwargs_mapping, template_kwargs_key, text_prompts_refused, trainer_template_kwargs


log = logging.getLogger(__name__)

# The placeholders an external trainer's settings may hold (filled per round).
EXTERNAL_PLACEHOLDERS = ("round", "run_dir")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OwnKind(_Strict):
    """A kind of this stage's own, not a trainer: what a workflow asks of its trainer section, with the defaults."""

    reads_text: ClassVar[bool] = False  # it may be handed text prompts (build keeps its own placement default)
    kwargs_key: ClassVar[str] = ""  # where its settings take chat-template variables (none of mentor's: "")
    needs_prompts: ClassVar[bool] = True  # it trains on (or answers) the round's prompts

    def sampled_policy(self) -> BackendSettings | None:
        """The policy mentor samples itself in each round (None: none)."""
        return None

    def check_rounds(self, rounds: int) -> None:
        """Checks of a run of `rounds` rounds, before the first (a `ConfigError`)."""

    def template_kwargs(self) -> Any:
        """The chat-template variables its settings pass (as given; None: none)."""
        return None

    def log_format(self) -> str:
        """The ``ingest --format`` of the round's logs."""
        return RECORDS_FORMAT

    def log_sources(self, train: Any) -> list[str]:
        """The round's logs, given the train stage's folder of the round (`mentor.pipeline.rundir.StageDir`)."""
        return [str(train.path / "logs")]


class OfflineTrainer(OwnKind):
    """No training: sample the policy on the round's prompts with `mentor rollout` (vLLM)."""

    reads_text: ClassVar[bool] = True  # `mentor rollout` sends text prompts as they are
    kwargs_key: ClassVar[str] = "rollout.chat_template_kwargs"

    kind: Literal["offline"]
    policy: BackendSettings = Field(default_factory=BackendSettings, description="The policy that answers the prompts.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="`mentor rollout` settings (k, max_tokens, temperature, ...); each round offsets the seed and stamps its round.",
    )

    def sampled_policy(self) -> BackendSettings:
        return self.policy

    def check_rounds(self, rounds: int) -> None:
        offline_seed(self, rounds - 1)  # the last round's seed stays in range

    def template_kwargs(self) -> Any:
        return self.rollout.chat_template_kwargs

    def log_format(self) -> str:
        return "canonical"  # `mentor rollout` writes canonical rollout shards


class ExternalTrainer(OwnKind):
    """A trainer mentor does not launch: wait for the round's rollout logs to appear."""

    needs_prompts: ClassVar[bool] = False  # it trains on whatever it trains on

    kind: Literal["external"]
    rollouts: str = Field(description="Glob of the round's logs; placeholders {round} {run_dir}.")
    format: str = Field(RECORDS_FORMAT, description="ingest --format of those logs.")
    sentinel: str | None = Field(None, description="A file whose appearance says the logs are complete (placeholders allowed).")
    settle_s: float = Field(10.0, ge=0, description="Without a sentinel: the logs are complete once unchanged this long.")
    timeout_s: float = Field(86400.0, gt=0, description="Give up waiting after this long.")
    poll_s: float = Field(5.0, gt=0, description="Polling interval.")

    @field_validator("rollouts", "sentinel")
    @classmethod
    def _placeholders(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("empty: give a glob (rollouts) or a file (sentinel); placeholders {round} {run_dir}")
        return v if v is None else check_placeholders(v, EXTERNAL_PLACEHOLDERS)

    def log_format(self) -> str:
        return self.format

    def log_sources(self, train: Any) -> list[str]:
        return read_json(train.done_dir / f"{train.done_key()}.done")["files"]  # the files the round waited for (its marker)


def trainer_union() -> Any:
    """The workflow's `trainer` section: one model per kind, each trainer's from its launcher's declaration."""
    sections = (OfflineTrainer, *(get_launcher(k).workflow_section() for k in trainer_kinds()), ExternalTrainer)
    return Annotated[Union[sections], Field(discriminator="kind")]  # noqa: UP007 (a tuple of models)


Trainer = trainer_union()


def offline_seed(t: OfflineTrainer, r: int) -> int:
    """The rollout seed of round `r` of an offline trainer: its base seed + 1000 per round, within the seeds' range."""
    seed = t.rollout.seed + 1000 * r
    if seed > SEED_MAX:
        raise ConfigError(f"trainer.rollout.seed {t.rollout.seed}: round {r} would sample with seed {seed} (the seed + 1000 "
                          f"per round), past the largest, {SEED_MAX}, where the seeds would repeat another's; pick a seed of at "
                          f"most {SEED_MAX - 1000 * r}")
    return seed


def launched(trainer: Any) -> bool:
    """Whether mentor launches this trainer as a `Launcher` round (a trainer kind with ``config``)."""
    return trainer.kind in trainer_kinds() and getattr(trainer, "config", None) is not None


# --------------------------------------------------------------------------- what a workflow asks of its trainer section


def section_policy(trainer: Any) -> BackendSettings | None:
    """The policy mentor samples itself in each round of this section (None: a trainer's own, or none)."""
    return trainer.sampled_policy() if isinstance(trainer, OwnKind) else None


def section_model(trainer: Any) -> str | None:
    """The policy model the section starts from (its tokenizer renders the prompts), where mentor knows it."""
    policy = section_policy(trainer)
    if policy is not None:
        return backend_kind(policy.backend).tokenizer(policy.model)
    config = getattr(trainer, "config", None) or {}
    return config.get("base_model") if isinstance(config, dict) else None


def check_section(trainer: Any, rounds: int, strict: bool = False) -> None:
    """The section's checks for a run of `rounds` rounds, before the first (a `ConfigError`): a launched trainer's round
    config (`strict`: also what needs the trainer's package here, as the round will), an own kind's (offline: the seeds)."""
    if isinstance(trainer, OwnKind):
        trainer.check_rounds(rounds)
    elif launched(trainer):
        if "kind" in trainer.config:
            raise ConfigError("trainer.config.kind: set by trainer.kind; remove it")
        get_launcher(trainer.kind).parse(trainer.config, "trainer.config", strict=strict)


def section_reads_text(trainer: Any) -> bool:
    """Whether the section may be handed text prompts (build then keeps its own placement default)."""
    if isinstance(trainer, OwnKind):
        return trainer.reads_text
    return trainer.kind in trainer_kinds() and text_prompts_refused(trainer.kind) is None


def section_kwargs_key(trainer: Any) -> str | None:
    """Where the section's settings take chat-template variables (None: the trainer has no such setting)."""
    if isinstance(trainer, OwnKind):
        return trainer.kwargs_key
    return template_kwargs_key(trainer.kind) if trainer.kind in trainer_kinds() else ""


def section_template_kwargs(trainer: Any) -> dict[str, Any] | None:
    """The chat-template variables the section passes (None: it sets none, or has no such setting)."""
    if isinstance(trainer, OwnKind):
        return kwargs_mapping(trainer.kwargs_key, trainer.template_kwargs())
    config = getattr(trainer, "config", None)
    return trainer_template_kwargs(trainer.kind, config) if isinstance(config, dict) else None


def section_logs(trainer: Any, train: Any) -> tuple[str | None, list[str]]:
    """(the ``ingest --format``, the files) of a round's logs, given the train stage's folder of the round."""
    if isinstance(trainer, OwnKind):
        return trainer.log_format(), trainer.log_sources(train)
    fmt = get_launcher(trainer.kind).log_format if trainer.kind in trainer_kinds() else None
    return fmt or getattr(trainer, "format", None), [str(train.path / "logs")]


class TrainConfig(_Strict):
    """One round's training: the workflow's trainer, or the existing logs that stand in for it."""

    round: int = Field(0, ge=0, description="The round (offline: offsets the rollout seed; launchers: round-NNN).")
    trainer: Trainer | None = Field(None, description="How the round's rollouts come to be.")
    initial_rollouts: list[str] | None = Field(
        None, description="Instead of a trainer: existing rollout files that stand in for this round (nothing runs).")

    @model_validator(mode="after")
    def _one(self) -> "TrainConfig":
        if (self.trainer is None) == (self.initial_rollouts is None):
            raise ValueError("give either trainer or initial_rollouts")
        return self


class TrainInputs(_Strict):
    """What the round trains on and where it stands: its prompt shards (none for existing logs), the run
    folder (``{run_dir}``; default: two folders above the stage's), and the last model an earlier round
    trained (none: the round starts from the base model)."""

    prompts: Source | None = None
    run_dir: Source | None = None
    prev_model: str | None = None


TRAIN_STATS = StatsLayout(
    counters=("rollouts",),
    values={"kind": None, "round": 0, "exit_code": None, "final_model": None, "files": None},
    logger=__name__,
)


class TrainStage(Stage):
    """A round's trainer (the kinds above); writes into its folder directly, with ``logs/`` the reward's rollout log."""

    name = "train"
    Inputs = TrainInputs
    Config = TrainConfig
    owns = Owns(("stats.json", OUTCOME, "train.log", "logs", "model"))
    staged = False  # a trainer resumes from its own checkpoints; its folder is never swapped
    needs_engine = True  # offline generates; every trainer needs the GPUs' memory free
    summary = ("kind", "rollouts", "exit_code", "final_model", "files")
    round_dir, round_order = "train", 10

    def round_job(self, rnd: Round) -> RoundJob:
        wf = rnd.workflow
        if rnd.index == 0 and wf.initial_rollouts is not None:
            # Existing logs stand in for round 0's training: recorded, nothing launched.
            return RoundJob({"initial_rollouts": wf.initial_rollouts.model_dump()}, {},
                            {"round": 0, "initial_rollouts": rnd.initial_sources()}, upstream=[rnd.initial_token()])
        # The prompts of the round before, or (no round built any yet) the base set's unhinted prompts.
        prompts, token = rnd.prompts()
        inputs = {"prompts": str(prompts), "run_dir": str(rnd.run_dir.path), "prev_model": self._prev_model(rnd)}
        return RoundJob(wf.trainer.model_dump(mode="json"), inputs, {"round": rnd.index, "trainer": wf.trainer},
                        Context(executor=rnd.executor()), upstream=[token])

    def _prev_model(self, rnd: Round) -> str | None:
        """The last model an earlier round trained (None: none did; the round starts from the base model)."""
        for j in range(rnd.index - 1, -1, -1):
            model = rnd.run_dir.stage(j, self).outcome().get("final_model")
            if model:
                return model
        return None

    def status(self, folder: Any) -> dict:
        o = folder.outcome()
        return {"exit_code": o.get("exit_code"), "final_model": o.get("final_model")} if o else {}

    def plan(self, inputs: TrainInputs, cfg: TrainConfig, out_dir: Path) -> TrainInputs:
        t = cfg.trainer
        if t is not None and (t.needs_prompts if isinstance(t, OwnKind) else True) and inputs.prompts is None:
            raise ConfigError(f"the {t.kind} trainer trains on the round's prompts: give prompts")
        if t is not None and launched(t):
            round_cfg = get_launcher(t.kind).parse(t.config, "trainer.config")  # its checks, before anything runs
            if getattr(round_cfg, "live_hints", None) is not None:  # the hint agents' settings: the hint stage's checks
                hint_config(round_cfg.live_hints, "trainer.config.live_hints")
        return inputs

    def run(self, inputs: TrainInputs, cfg: TrainConfig, out_dir: Path, ctx: Context) -> Stats:
        stats = TRAIN_STATS(round=cfg.round)
        t = cfg.trainer
        if t is None:
            stats.kind, stats.files = "initial_rollouts", list(cfg.initial_rollouts or [])
            return stats
        release_engines(ctx.executor)  # an earlier stage's, here or in the dask workers
        logs = out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        run_dir = Path(inputs.run_dir) if inputs.run_dir else out_dir.parent.parent
        stats.kind = t.kind
        if isinstance(t, OfflineTrainer):
            rollout = t.rollout.model_copy(update={"seed": offline_seed(t, cfg.round), "round": cfg.round})
            stats.rollouts = ROLLOUT({"prompts": [inputs.prompts]}, rollout, logs, Context(backend=t.policy.spec())).rollouts
        elif launched(t):
            launcher = get_launcher(t.kind)
            # No earlier round trained a model (round 0 stood on existing logs): start from the base model.
            round_cfg = launcher.parse(t.config, "trainer.config").for_round(
                cfg.round, prompts=inputs.prompts, round_dir=out_dir.parent, train_dir=out_dir, rollout_dir=logs,
                prev_model=inputs.prev_model, start_from_base=inputs.prev_model is None)
            outcome = launcher.run_round(round_cfg)
            stats.exit_code, stats.final_model = outcome.get("exit_code"), outcome.get("final_model")
            stats.extra.update({k: outcome.get(k) for k in launcher.summary})
        elif t.kind in trainer_kinds():  # a form of its section the trainer runs itself (a user's own command)
            ph = {"prompts": str(inputs.prompts), "rollout_dir": str(logs), "round": str(cfg.round), "run_dir": str(run_dir),
                  "prev_model": inputs.prev_model or "", "model": inputs.prev_model or ""}
            stats.exit_code, stats.final_model = get_launcher(t.kind).run_section(t, cfg.round, ph, out_dir)
        else:
            stats.files = _wait_for_logs(t, cfg.round, run_dir)
        return stats


# How often a long wait for an external trainer says that it is still waiting, and for what.
WAIT_REPORT_S = 300.0


def _wait_for_logs(t: ExternalTrainer, r: int, run_dir: Path) -> list[str]:
    """An external trainer's round: its logs, once the sentinel appears or (without one) they stop changing.

    The wait can be long (a day by default): it says what it waits for when it starts and every
    `WAIT_REPORT_S` seconds after, with what it has found so far."""
    ph = {"round": str(r), "run_dir": str(run_dir)}
    pattern = t.rollouts.format(**ph)
    sentinel = Path(t.sentinel.format(**ph)) if t.sentinel else None
    until = f"{sentinel} appears" if sentinel else f"they stay unchanged for {t.settle_s:g}s"
    log.info("round %d: waiting up to %s for the external trainer's rollout logs %s, complete once %s",
             r, _duration(t.timeout_s), pattern, until)
    started = time.monotonic()
    deadline, report_at = started + t.timeout_s, started + WAIT_REPORT_S
    last, stable_since = None, None
    while True:
        files = sorted(map(str, glob_files(pattern)))  # bounded, and ends on symlink loops
        state = [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files if os.path.isfile(f)]
        now = time.monotonic()
        if state and (sentinel.exists() if sentinel else False):
            break
        if state and sentinel is None:
            if state == last:
                if now - stable_since >= t.settle_s:
                    break
            else:
                last, stable_since = state, now
        if now > deadline:
            raise DataError(f"round {r}: no complete rollout logs matched {pattern} within {t.timeout_s:.0f}s"
                            + (f" (waiting for {sentinel})" if sentinel else ""))
        if now >= report_at:
            report_at = now + WAIT_REPORT_S
            log.info("round %d: still waiting (%s of %s) for the external trainer: %d file(s) match %s; %s",
                     r, _duration(now - started), _duration(t.timeout_s), len(state), pattern,
                     f"{sentinel} is not there yet" if sentinel else f"complete once unchanged for {t.settle_s:g}s")
        time.sleep(t.poll_s)
    return [f for f, _, _ in state]


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:g}s"


STAGE = TRAIN = TrainStage()


__all__ = ["STAGE", "TRAIN", "TRAIN_STATS", "ExternalTrainer", "OfflineTrainer", "OwnKind", "TrainConfig", "TrainInputs",
           "TrainStage", "Trainer", "check_section", "launched", "offline_seed", "section_kwargs_key", "section_logs",
           "section_model", "section_policy", "section_reads_text", "section_template_kwargs", "trainer_union"]
