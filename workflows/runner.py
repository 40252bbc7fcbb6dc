"""The round-by-round runner behind `mentor run`, `mentor demo` and `mentor status`.

Each round is a loop over the round stages (`mentor.stages.round_stages`: every stage that
declares ``round_order``), in order; the built-in ones:

    train (a trainer's round, training/<kind>/ / offline rollout / wait for an external trainer)
      -> ingest -> mine (with earlier rounds as history) -> hint -> build

The runner knows no stage by name: each declares what it reads in a round
(``Stage.round_job``: its resume key's config and upstream tokens, its inputs, config and
context), the folder it writes (``round_dir``), its status columns, and whether the next
round trains on its output (``feeds_next_round``), in the run-directory layout of
`mentor.pipeline.rundir`. A stage runs only if its done marker for the current key is
missing; the key hashes the stage's config and the fingerprints of what it reads, so a
re-run skips finished work, a changed config re-runs that stage and what follows, and a
run killed at any moment resumes to the same result.

Each stage is called through the driver (`mentor.pipeline.stage.run_stage` with its key):
it gets the run's executor (this process, or the dask cluster of ``--workers`` /
``--scheduler``), writes its outputs and stats.json; the driver writes the done marker with
a few of the counts. What is not a stage stays here: the base problems (read once), the
workflow-wide checks before the first round (the trainer section's, `stages.train.check_section`), and
build's defaults from the trainer (`Runner.build_settings`). The base set's unhinted prompts
round 0 trains on without logs come from the stage that feeds the next round (`Stage.base_job`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mentor.data import bundled
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.executor import Executor, executor_for
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import atomic_path, config_hash, read_json, write_parquet_atomic
from mentor.pipeline.rundir import RunDir, StageDir, inputs_key, stage_key
from mentor.pipeline.stage import RoundJob, Stage, read_done, run_stage, write_done
from mentor.stages import round_names, round_stages
from mentor.stages.build import BUILD_STATS
from mentor.stages.build_base import load_base, validate_base
from mentor.stages.build_render import DEFAULT_PLACEMENT
from mentor.stages.train import check_section, section_model, section_reads_text, section_template_kwargs
from mentor.workflows.config import Workflow, check_sections

log = logging.getLogger(__name__)



@dataclass
class RunOptions:
    rounds: int | None = None  # override the workflow's number of rounds
    from_stage: str | None = None  # re-run this stage and the later ones (every selected round)
    only: str | None = None  # re-run just this stage (its inputs must be done), in every selected round
    force: bool = False
    client: Any = None  # a dask.distributed Client: mine and hint shards run on its cluster (DaskExecutor); None = here
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("from_stage", "only"):
            v = getattr(self, name)
            if v is not None and v not in round_names():
                raise ConfigError(f"--{name.replace('_', '-')} {v!r}: choose one of {', '.join(round_names())}")


@dataclass
class Runner:
    wf: Workflow
    run_dir: Path
    opts: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        self.rd = RunDir(Path(self.run_dir))
        self._forced: set[tuple[int, str]] = set()
        self.ran: list[tuple[int, str]] = []
        self.skipped: list[tuple[int, str]] = []
        self._base_token = ""
        self._next_prompts: tuple[Path, str] | None = None  # the prompts the next round trains on, with their token

    # ------------------------------------------------------------------ driver

    def run(self) -> list[tuple[int, str]]:
        check_sections(self.wf)  # every section, before any stage runs (load_workflow did too, naming the file)
        # The trainer section strictly, as the round will (a trainer package missing here must not surface only after
        # round 0's hints), for --rounds, which may run more rounds than the workflow says (offline: the seeds in range).
        check_section(self.wf.trainer, self.opts.rounds or self.wf.rounds, strict=True)
        self._base_token = self._base_problems()  # validated before any stage runs (or the run folder is made)
        self.rd.path.mkdir(parents=True, exist_ok=True)
        self._save_workflow()
        self._next_prompts = None  # round 0 trains on the base set's prompts
        stages = round_stages()
        for r in range(self.opts.rounds or self.wf.rounds):
            log.info("round %d", r)
            rnd = _Round(self, r, {})  # each stage's token (key + output fingerprint), for the ones after it
            for st in stages:
                rnd.tokens[st.name] = self._step(r, st, st.round_job(rnd))
                if st.feeds_next_round:
                    self._next_prompts = (self.rd.stage(r, st).path, rnd.tokens[st.name])
        return self.ran

    def _step(self, r: int, stage: Stage, job: RoundJob) -> str:
        """Run one stage of the round unless done (the driver, `run_stage` with the stage's key, keeps its folder's
        bookkeeping and writes its done marker); returns its token (key + output fingerprint) for what follows."""
        name, names = stage.name, round_names()
        sd = self.rd.stage(r, stage)
        key = stage_key(name, job.key, job.upstream)
        forced = self.opts.force or self.opts.only == name or (
            self.opts.from_stage is not None and names.index(name) >= names.index(self.opts.from_stage)
        )
        if self.opts.only is not None and name != self.opts.only:
            if not sd.is_done(key):
                raise ConfigError(f"--only {self.opts.only}: round {r}'s {name} stage is not done for the current config; run it first")
            return self.token(sd, key)
        if sd.is_done(key) and not (forced and (r, name) not in self._forced):
            log.info("round %d %s: done (%s), skipped", r, name, key)
            self.skipped.append((r, name))
            return self.token(sd, key)
        self._forced.add((r, name))
        run_stage(stage, job.inputs, job.cfg, sd.path, job.ctx, key=key)
        self.ran.append((r, name))
        return self.token(sd, key)

    @staticmethod
    def token(sd: StageDir, key: str) -> str:
        marker = sd.done_dir / f"{key}.done"
        return f"{key}:{read_json(marker).get('fingerprint', '')}"

    def _save_workflow(self) -> None:
        with atomic_path(self.rd.path / "workflow.yaml") as tmp:
            tmp.write_text(yaml.safe_dump(self.wf.model_dump(mode="json"), sort_keys=False))

    # ------------------------------------------------------------------ inputs

    def _base_problems(self) -> str:
        """The base set as a PROBLEMS Parquet in the run dir (read once; ingest and build use it)."""
        path = self.rd.path / "base" / "problems.parquet"
        marker = self.rd.path / "base" / "_done" / "problems.done"  # a done marker, as every stage's
        source = {"base": self.wf.base, "map": self.wf.base_map, "domain": self.wf.domain}
        key = config_hash(source)
        if not (path.exists() and read_done(marker, key)):
            base = load_base(self.wf.base, self.wf.base_map, self.wf.domain)
            # The checks build would make rounds later (duplicate ids, no usable rows, --strict drops).
            validate_base(base, bool(self.wf.build.get("strict", False)), BUILD_STATS())
            write_parquet_atomic(base.frame, path, dataset="problems")
            write_done(marker, key, **source)
        return inputs_key([path])

    @property
    def problems_path(self) -> Path:
        return self.rd.path / "base" / "problems.parquet"

    def initial_sources(self) -> list[str]:
        out = []
        for s in self.wf.initial_rollouts.source:
            out.append(str(bundled(f"{s.split(':', 1)[1]}_rollouts.parquet")) if s.startswith("bundled:") else s)
        return out

    def initial_token(self) -> str:
        files = resolve_inputs(self.initial_sources(), suffixes=(".parquet", ".jsonl", ".json", ".jsonl.gz"))
        return "initial:" + inputs_key(files)

    def base_prompts(self) -> tuple[Path, str]:
        """Unhinted prompts of the base set: what round 0's trainer trains on without initial logs (made by the
        stage that makes what the next round trains on, ``feeds_next_round``: `Stage.base_job`)."""
        feeder = next(s for s in round_stages() if s.feeds_next_round)
        sd = self.rd.base_prompts(feeder)
        job = feeder.base_job(_Round(self, 0, {}))
        key = stage_key("base-prompts", job.key, job.upstream)
        if not sd.is_done(key):
            run_stage(feeder, job.inputs, job.cfg, sd.path, job.ctx, key=key)
        return sd.path, self.token(sd, key)

    def build_settings(self) -> dict:
        """The build section, with the round's policy as tokenizer unless it names one (so build counts
        max_prompt_tokens and, for a trainer that takes text prompts, opens the answer with the hint by
        default), and the trainer's chat-template variables unless it sets its own; a trainer that reads
        only chat messages keeps a message placement by default."""
        b = dict(self.wf.build)
        tok = b.get("tokenizer") or section_model(self.wf.trainer)
        if tok:
            b["tokenizer"] = tok
        if not section_reads_text(self.wf.trainer) and b.get("placement") is None and b.get("template") is None:
            b["placement"] = DEFAULT_PLACEMENT
        if "chat_template_kwargs" not in b:  # the trainer's template variables render (and count) the prompts too
            theirs = section_template_kwargs(self.wf.trainer)
            if theirs:
                b["chat_template_kwargs"] = theirs
        return b


@dataclass
class _Round:
    """What a round stage's `Stage.round_job` is told of the round it runs in (`mentor.pipeline.stage.Round`)."""

    runner: Runner
    index: int
    tokens: dict[str, str]

    workflow = property(lambda self: self.runner.wf)
    run_dir = property(lambda self: self.runner.rd)
    base_token = property(lambda self: self.runner._base_token)
    problems_path = property(lambda self: self.runner.problems_path)
    progress = property(lambda self: self.runner.opts.progress)

    def executor(self, resources: Any = None) -> Executor:
        return executor_for(self.runner.opts.client, resources=resources)

    def token(self, folder: StageDir, key: str) -> str:
        return self.runner.token(folder, key)

    def initial_sources(self) -> list[str]:
        return self.runner.initial_sources()

    def initial_token(self) -> str:
        return self.runner.initial_token()

    def prompts(self) -> tuple[Path, str]:
        return self.runner._next_prompts or self.runner.base_prompts()

    def build_settings(self) -> dict:
        return self.runner.build_settings()


# ---------------------------------------------------------------------- status


def run_status(run_dir: str | Path) -> list[dict[str, Any]]:
    """One row per round and stage: state, counts from stats.json, the last error."""
    rd = RunDir(Path(run_dir))
    if not rd.path.exists():
        raise ConfigError(f"{run_dir}: no such run directory")
    if not rd.is_run():
        raise ConfigError(f"{run_dir}: not a run directory (no workflow.yaml, no round-NNN folder); give the folder "
                          "`mentor run` writes (runs/<name>, or its --run-dir)")
    rows = []
    stages = round_stages()
    for r in rd.rounds():
        for stage in stages:
            sd = rd.stage(r, stage)
            row: dict[str, Any] = {"round": r, "stage": stage.name, "state": sd.state()}
            row.update({k: _shown(v) for k, v in stage.status(sd).items()})
            err = sd.last_error()
            if err:
                row["error"] = err.splitlines()[0][:300]
            rows.append(row)
    return rows


def _shown(value: Any) -> Any:
    """A value of a bookkeeping file as status shows it: a number or a short text; anything else (edited by hand) as None."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= 300 else value[:297] + "..."
    return None
