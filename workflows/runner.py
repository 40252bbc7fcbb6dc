"""The round-by-round runner behind `mentor run`, `mentor demo` and `mentor status`.

Each round is a loop over the round's stages (`mentor.stages.ROUND_STAGES`), in order:

    train (a trainer's round, training/<kind>/ / offline rollout / wait for an external trainer)
      -> ingest -> mine (with earlier rounds as history) -> hint -> build

each a `Stage` the runner calls the same way (``_<stage>_job`` says what it reads),
in the run-directory layout of `mentor.pipeline.rundir`. A stage runs only if
its done marker for the current key is missing; the key hashes the stage's
config and the fingerprints of what it reads, so a re-run skips finished
work, a changed config re-runs that stage and what follows, and a run killed
at any moment resumes to the same result.

Each stage is called through the stage contract (`mentor.pipeline.stage`): it
gets the run's executor (this process, or the dask cluster of ``--workers`` /
``--scheduler``), writes its outputs and stats.json, returns its `Stats`; the
runner then writes the done marker (`StageDir.finish`) with a few of the counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mentor.data import bundled
from mentor.pipeline.backends import kind as backend_kind
from mentor.pipeline.errors import ConfigError, MentorError
from mentor.pipeline.executor import executor_for
from mentor.pipeline.faults import fault_point
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import atomic_path, config_hash, files_hash, read_json, write_parquet_atomic
from mentor.pipeline.rundir import RunDir, StageDir, inputs_key, stage_key
from mentor.pipeline.stage import Context, counts, read_done, run_stage, write_done
from mentor.stages import ROUND_STAGES
from mentor.stages import stage as stage_by_name
from mentor.stages.build import BUILD_STATS, BuildConfig
from mentor.stages.build_base import load_base, validate_base
from mentor.stages.build_render import DEFAULT_PLACEMENT
from mentor.stages.train import launched, offline_seed
from mentor.training.launcher import get_launcher, trainer_kinds
from mentor.training.prompt_format import text_readers
from mentor.workflows.config import Workflow, check_sections, workflow_template_kwargs

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
            if v is not None and v not in ROUND_STAGES:
                raise ConfigError(f"--{name.replace('_', '-')} {v!r}: choose one of {', '.join(ROUND_STAGES)}")


def outputs_fingerprint(path: Path) -> str:
    """Content fingerprint of a stage's data outputs (Parquet and JSONL files, not bookkeeping)."""
    files = sorted(path.rglob("*")) if path.exists() else []
    return files_hash((str(f.relative_to(path)), f) for f in files if f.is_file() and f.suffix in (".parquet", ".jsonl")
                      and not any(part.startswith(("_", ".")) for part in f.relative_to(path).parts))


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
        t = self.wf.trainer
        if launched(t):
            # Strictly, as the round will: a trainer package missing here must not surface only after round 0's hints.
            get_launcher(t.kind).parse(t.config, "trainer.config")
        if t.kind == "offline":  # --rounds may run more rounds than the workflow says: the last one's seed in range
            offline_seed(t, (self.opts.rounds or self.wf.rounds) - 1)
        self._base_token = self._base_problems()  # validated before any stage runs (or the run folder is made)
        self.rd.path.mkdir(parents=True, exist_ok=True)
        self._save_workflow()
        self._next_prompts = None  # round 0 trains on the base set's prompts
        for r in range(self.opts.rounds or self.wf.rounds):
            log.info("round %d", r)
            tokens: dict[str, str] = {}  # each stage's token (key + output fingerprint), for the ones after it
            for name in ROUND_STAGES:
                job = getattr(self, f"_{name}_job")(r, tokens)
                tokens[name] = self._stage(r, job)
            self._next_prompts = (self.rd.stage(r, "build").path, tokens["build"])
        return self.ran

    def _stage(self, r: int, job: "_Job") -> str:
        """Run one stage of the round (`mentor.stages.stage`) the one way: `run_stage`, its counts in the marker."""
        def work(sd: StageDir) -> dict:
            stage = stage_by_name(job.stage)
            return counts(run_stage(stage, job.inputs, job.cfg, sd.path, job.ctx), stage.summary)

        return self._step(r, job.stage, job.key, job.upstream, work)

    def _step(self, r: int, stage: str, config: Any, upstream: list[str], fn: Callable[[StageDir], dict]) -> str:
        """Run one stage unless done; returns its token (key + output fingerprint) for what follows."""
        sd = self.rd.stage(r, stage)
        key = stage_key(stage, config, upstream)
        forced = self.opts.force or self.opts.only == stage or (
            self.opts.from_stage is not None and ROUND_STAGES.index(stage) >= ROUND_STAGES.index(self.opts.from_stage)
        )
        if self.opts.only is not None and stage != self.opts.only:
            if not sd.is_done(key):
                raise ConfigError(f"--only {self.opts.only}: round {r}'s {stage} stage is not done for the current config; run it first")
            return self._token(sd, key)
        if sd.is_done(key) and not (forced and (r, stage) not in self._forced):
            log.info("round %d %s: done (%s), skipped", r, stage, key)
            self.skipped.append((r, stage))
            return self._token(sd, key)
        self._forced.add((r, stage))
        sd.begin(key)
        try:
            info = fn(sd) or {}
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, MentorError) else f"{type(exc).__name__}: {exc}"
            sd.fail(msg)
            raise
        fault_point(f"{stage}.before_marker")
        sd.finish(key, info | {"fingerprint": outputs_fingerprint(sd.path)})
        self.ran.append((r, stage))
        return self._token(sd, key)

    @staticmethod
    def _token(sd: StageDir, key: str) -> str:
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

    def _initial_sources(self) -> list[str]:
        out = []
        for s in self.wf.initial_rollouts.source:
            out.append(str(bundled(f"{s.split(':', 1)[1]}_rollouts.parquet")) if s.startswith("bundled:") else s)
        return out

    def _initial_token(self) -> str:
        files = resolve_inputs(self._initial_sources(), suffixes=(".parquet", ".jsonl", ".json", ".jsonl.gz"))
        return "initial:" + inputs_key(files)

    def _base_prompts(self, base_token: str) -> tuple[Path, str]:
        """Unhinted prompts of the base set: what round 0's trainer trains on without initial logs."""
        sd = self.rd.base_prompts()
        cfg = BuildConfig.model_validate(self.build_settings() | {"base": str(self.problems_path), "hints": [], "round": 0})
        key = stage_key("base-prompts", cfg.model_dump(exclude={"base"}), [base_token])
        if not sd.is_done(key):
            sd.begin(key)
            stats = run_stage(stage_by_name("build"), {}, cfg, sd.path)
            sd.finish(key, {"rows": stats.rows, "fingerprint": outputs_fingerprint(sd.path)})
        return sd.path, self._token(sd, key)

    def _history(self, r: int) -> tuple[list[str], list[str]]:
        """Earlier rounds' collapsed and hints outputs, with their tokens."""
        paths, tokens = [], []
        for j in range(r):
            for stage, name in (("mine", "collapsed.parquet"), ("hint", "hints.parquet")):
                sd = self.rd.stage(j, stage)
                f = sd.path / name
                key = sd.done_key()
                if f.exists() and key:
                    paths.append(str(f))
                    tokens.append(self._token(sd, key))
        return paths, tokens

    # ------------------------------------------------------------------ stages

    def _train_job(self, r: int, tokens: dict[str, str]) -> "_Job":
        if r == 0 and self.wf.initial_rollouts is not None:
            # Existing logs stand in for round 0's training: recorded, nothing launched.
            return _Job("train", {"initial_rollouts": self.wf.initial_rollouts.model_dump()}, {},
                        {"round": 0, "initial_rollouts": self._initial_sources()}, upstream=[self._initial_token()])
        # The prompts of the round before, or (no round built any yet) the base set's unhinted prompts.
        prompts, token = self._next_prompts or self._base_prompts(self._base_token)
        inputs = {"prompts": str(prompts), "run_dir": str(self.rd.path), "prev_model": self._prev_model(r)}
        return _Job("train", self.wf.trainer.model_dump(mode="json"), inputs, {"round": r, "trainer": self.wf.trainer},
                    Context(executor=executor_for(self.opts.client)), upstream=[token])

    def _prev_model(self, r: int) -> str | None:
        """The last model an earlier round trained (None: none did; the round starts from the base model)."""
        for j in range(r - 1, -1, -1):
            f = self.rd.stage(j, "train").path / "outcome.json"
            if f.exists():
                model = read_json(f).get("final_model")
                if model:
                    return model
        return None

    def _ingest_config(self, r: int) -> dict:
        if r == 0 and self.wf.initial_rollouts is not None:
            return {"format": self.wf.initial_rollouts.format, "map": self.wf.initial_rollouts.map, "round": r}
        kind = self.wf.trainer.kind  # offline: mentor's own rollouts; a trainer: the format its reward logs in
        fmt = "canonical" if kind == "offline" else get_launcher(kind).log_format if kind in trainer_kinds() else None
        return {"format": fmt or self.wf.trainer.format, "round": r}

    def _ingest_job(self, r: int, tokens: dict[str, str]) -> "_Job":
        key = self._ingest_config(r)
        train = self.rd.stage(r, "train")
        if r == 0 and self.wf.initial_rollouts is not None:
            sources = self._initial_sources()
        elif self.wf.trainer.kind == "external":  # the files the train stage waited for (its marker)
            sources = read_json(train.done_dir / f"{train.done_key()}.done")["files"]
        else:
            sources = [str(train.path / "logs")]
        cfg = {"format": key["format"], "round": r, "domain": self.wf.domain, "mapping": key.get("map") or {},
               "problems": str(self.problems_path)}
        return _Job("ingest", key, {"sources": sources}, cfg, upstream=[tokens["train"], self._base_token])

    def _mine_job(self, r: int, tokens: dict[str, str]) -> "_Job":
        history, history_tokens = self._history(r)
        return _Job("mine", self.wf.mine, {"sources": [str(self.rd.stage(r, "ingest").path)], "history": history},
                    self.wf.mine, Context(executor=executor_for(self.opts.client)), upstream=[tokens["ingest"], *history_tokens])

    def _hint_job(self, r: int, tokens: dict[str, str]) -> "_Job":
        h = self.wf.hint
        # On a GPU cluster each hint task needs the workers' GPU resource (one engine per worker).
        ctx = Context(executor=executor_for(self.opts.client, resources=h.worker_resources), backend=h.backend.spec(),
                      progress=self.opts.progress)
        inputs = {"collapsed": [str(self.rd.stage(r, "mine").path / "collapsed.parquet")], "sample": h.sample}
        return _Job("hint", h.model_dump(exclude={"worker_resources"}), inputs, h.config, ctx, upstream=[tokens["mine"]])

    def build_settings(self) -> dict:
        """The build section, with the round's policy as tokenizer unless it names one (so build counts
        max_prompt_tokens and, for a trainer that takes text prompts, opens the answer with the hint by
        default), and the trainer's chat-template variables unless it sets its own; a trainer that reads
        only chat messages keeps a message placement by default."""
        b = dict(self.wf.build)
        tok = b.get("tokenizer") or trainer_policy(self.wf.trainer)
        if tok:
            b["tokenizer"] = tok
        if self.wf.trainer.kind not in text_readers() and b.get("placement") is None and b.get("template") is None:
            b["placement"] = DEFAULT_PLACEMENT
        if "chat_template_kwargs" not in b:  # the trainer's template variables render (and count) the prompts too
            theirs = workflow_template_kwargs(self.wf.trainer)
            if theirs:
                b["chat_template_kwargs"] = theirs
        return b

    def _build_job(self, r: int, tokens: dict[str, str]) -> "_Job":
        hints = self.rd.stage(r, "hint").path / "hints.parquet"
        settings = self.build_settings()
        cfg = settings | {"base": str(self.problems_path), "hints": [str(hints)] if hints.exists() else [], "round": r + 1}
        return _Job("build", settings, {}, cfg, upstream=[tokens["hint"], self._base_token])


def trainer_policy(trainer: Any) -> str | None:
    """The policy model a workflow's trainer starts from (its tokenizer renders the prompts), where mentor knows it."""
    if trainer.kind == "offline":
        return backend_kind(trainer.policy.backend).tokenizer(trainer.policy.model)
    config = getattr(trainer, "config", None) or {}
    return config.get("base_model") if isinstance(config, dict) else None


@dataclass
class _Job:
    """One stage of a round: its name, what its resume key hashes, what `run_stage` gets, and the tokens of
    what it reads (the stages before it: a change there re-runs it)."""

    stage: str
    key: Any
    inputs: dict[str, Any]
    cfg: Any
    ctx: Context = field(default_factory=Context)
    upstream: list[str] = field(default_factory=list)


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
    for r in rd.rounds():
        for stage in ROUND_STAGES:
            sd = rd.stage(r, stage)
            st = {k: _shown(v) for k, v in sd.stats().items()}
            row: dict[str, Any] = {"round": r, "stage": stage, "state": sd.state()}
            if stage == "ingest":
                row.update(rows=st.get("rollouts"), problems=st.get("problems"))
            elif stage == "mine":
                row.update(rows=st.get("collapsed"), problems=st.get("problems"), collapse_rate=st.get("collapse_rate"),
                           cut=st.get("cut"), cut_share=st.get("cut_share"))
            elif stage == "hint":
                row.update(rows=st.get("problems"), accepted=st.get("accepted"), repaired=st.get("repaired"), fallback=st.get("fallback"))
            elif stage == "build":
                row.update(rows=st.get("rows"), hinted=st.get("hinted_rows", st.get("hinted")))
            elif stage == "train":
                o = sd.outcome()
                if o:
                    row.update(exit_code=_shown(o.get("exit_code")), final_model=_shown(o.get("final_model")))
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
