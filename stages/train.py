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
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.inputs import glob_files
from mentor.pipeline.llm import BackendSettings, release_engines
from mentor.pipeline.outdir import Owns
from mentor.pipeline.schemas import RECORDS_FORMAT
from mentor.pipeline.stage import Context, Round, RoundJob, Source, Stage, Stats, StatsLayout
from mentor.stages.hint.live import hint_config
from mentor.stages.rollout import ROLLOUT, SEED_MAX, RolloutConfig
from mentor.training.launcher import OUTCOME, check_placeholders, get_launcher, trainer_kinds


log = logging.getLogger(__name__)

# The placeholders an external trainer's settings may hold (filled per round).
EXTERNAL_PLACEHOLDERS = ("round", "run_dir")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OfflineTrainer(_Strict):
    """No training: sample the policy on the round's prompts with `mentor rollout` (vLLM)."""

    kind: Literal["offline"]
    policy: BackendSettings = Field(default_factory=BackendSettings, description="The policy that answers the prompts.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="`mentor rollout` settings (k, max_tokens, temperature, ...); each round offsets the seed and stamps its round.",
    )


class ExternalTrainer(_Strict):
    """A trainer mentor does not launch: wait for the round's rollout logs to appear."""

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
        if t is not None and t.kind != "external" and inputs.prompts is None:
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
        if t.kind == "offline":
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


__all__ = ["STAGE", "TRAIN", "TRAIN_STATS", "ExternalTrainer", "OfflineTrainer", "TrainConfig", "TrainInputs", "TrainStage",
           "Trainer", "launched", "offline_seed", "trainer_union"]
