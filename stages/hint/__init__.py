"""Hint: turn collapsed problems into answer-free hints with four LLM agents (the stage).

The hint stage is this package, one room with one way through:

    config.py       HintConfig: every setting of the stage (judge check and vouching included)
    agent.py        `Agent`: what an agent file declares (its role in the state machine, switch, templates, ...)
    agents/         the agents, one file each (attribution, generation, judgment, repair), their templates beside them
    prompt_templates.py  the templates: bundled, overridable per file, hashed into the prompt version
    machine.py      the state machine: a shard of problems through the agents, in waves (`hint_shard`)
    judge_check.py  the LLM judge scored on known-good and known-bad hints before the run trusts it
    vouch.py        a hint kept only when the policy, re-rolled with it, earns reward
    __init__.py     `HintStage`: the collapsed set in resumable shards, into hints.parquet

Shards. `HintStage` splits the collapsed set into resumable shards
(`mentor.pipeline.shards`: ``_shards/part-NNNNN.parquet``, a done marker keyed by
the shard's rows and the config), runs them with the stage's executor
(`mentor.pipeline.executor`: in-process, or dask workers that each own one engine
built from a picklable `BackendSpec`), and concatenates them into
``hints.parquet`` + ``stats.json``. A killed run resumes without redoing finished
shards; a re-run of the same inputs and config makes no engine call (and starts no
engine).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.executor import Executor
from mentor.pipeline.inputs import resolve_inputs
from mentor.pipeline.io import read_table, write_parquet_atomic
from mentor.pipeline.llm import Backend, describe_backend
from mentor.pipeline.outdir import Owns
from mentor.pipeline.schemas import HINTS, SCHEMA_VERSION, conform
from mentor.pipeline.shards import Shard, ShardPlan
from mentor.pipeline.stage import Context, Round, RoundJob, Source, Stage, Stats
from mentor.stages.hint.prompt_templates import Templates
from mentor.stages.hint.config import HintConfig
from mentor.stages.hint.judge_check import checked_config, stats_view
from mentor.stages.hint.machine import HintStats, hint_shard
from mentor.stages.hint.vouch import per_rescued, vouch_shard
from mentor.stages.solutions import load_solutions, with_solutions

log = logging.getLogger(__name__)


def _hint_task(shard: Shard, cfg: HintConfig, backend_factory: Callable[[], Backend],
               progress: Callable[[int, int], None] | None = None) -> tuple[pa.Table, dict]:
    """One shard's hints and what its done marker records (the shard's stats). Top-level: picklable for dask."""
    rows = shard.items
    st = HintStats()
    try:
        if cfg.vouch is not None:
            table = vouch_shard(rows, cfg, backend_factory(), stats=st, progress=progress)
        else:
            table = hint_shard(rows, cfg, backend_factory(), stats=st, progress=progress)
    except EngineError as exc:
        first = rows[0]["problem_id"] if rows else "-"
        raise shard.failure(exc, f"{len(rows)} problems from {first}", detail=f" after {st.waves} waves") from exc
    return table, {"stats": st.as_dict()}


class _Ticker:
    """``progress(problems, wave)`` for `_hint_task`: moves the bar in the process that made it.

    A task run elsewhere (a dask worker process) gets a copy that does nothing; the
    bar then moves when the shard's result comes back.
    """

    _bars: dict[int, Any] = {}

    def __init__(self, bar: Any) -> None:
        self.pid, self.key = os.getpid(), id(bar)
        self._bars[self.key] = bar

    def __call__(self, n: int, wave: int) -> None:
        bar = self._bars.get(self.key) if os.getpid() == self.pid else None
        if bar is not None:
            bar.update(n)
            bar.set_postfix(wave=wave, refresh=False)

    def __enter__(self) -> "_Ticker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bars.pop(self.key, None)


def shard_size_for(cfg: HintConfig, n: int, executor: Executor) -> int:
    """Problems per shard: the config's, or, when it was not set and dask has W engine workers, ``ceil(n / W)``.

    One shard is one worker's batch of waves: with the default (512) a run of 432
    problems would keep 1 of 8 engines busy. A shard size given in the config is kept.
    """
    workers = executor.workers()
    if "shard_size" in cfg.model_fields_set or workers <= 1 or n <= 0:
        return cfg.shard_size
    return min(cfg.shard_size, -(-n // workers))


class HintInputs(BaseModel):
    """What `mentor hint` reads: collapsed sets, and how many of their problems (problem_id order; None: all)."""

    model_config = ConfigDict(extra="forbid")

    collapsed: list[Source]
    sample: int | None = None


class HintStage(Stage):
    """Hint a collapsed dataset into ``hints.parquet`` and ``stats.json``.

    Shards are resumable (`mentor.pipeline.shards`): ``_shards/part-NNNNN.parquet``
    with a done marker in ``_shards/_done/`` keyed by the shard's rows, the config,
    the prompt version and the backend description, so finished shards are reused and
    any change recomputes exactly what it affects.
    """

    name = "hint"
    Inputs = HintInputs
    Config = HintConfig
    owns = Owns(("hints.parquet", "stats.json", "judge_check.json", "_shards"))
    staged = False
    needs_engine = True
    summary = ("problems", "accepted", "repaired", "fallback", "engine_calls")
    round_dir, round_order = "hints", 40
    status_columns = {"rows": ("problems",), "accepted": ("accepted",), "repaired": ("repaired",), "fallback": ("fallback",)}

    def round_job(self, rnd: Round) -> RoundJob:
        h = rnd.workflow.hint
        # On a GPU cluster each hint task needs the workers' GPU resource (one engine per worker).
        ctx = Context(executor=rnd.executor(h.worker_resources), backend=h.backend.spec(), progress=rnd.progress)
        inputs = {"collapsed": [str(rnd.run_dir.stage(rnd.index, "mine").path / "collapsed.parquet")], "sample": h.sample}
        return RoundJob(h.model_dump(exclude={"worker_resources"}), inputs, h.config, ctx, upstream=[rnd.tokens["mine"]])

    def plan(self, inputs: HintInputs, cfg: HintConfig, out_dir: Path) -> HintInputs:
        if inputs.sample is not None and inputs.sample < 1:
            raise ConfigError(f"--sample must be >= 1, got {inputs.sample}")
        return inputs.model_copy(update={"collapsed": [str(p) for p in resolve_inputs(inputs.collapsed)]})

    def run(self, inputs: HintInputs, cfg: HintConfig, out_dir: Path, ctx: Context) -> Stats:
        backend_factory, executor, sample = ctx.engine("hint"), ctx.executor, inputs.sample
        table = read_table([Path(p) for p in inputs.collapsed], "collapsed").sort_by("problem_id")
        whole = table  # the judge check draws on every collapsed problem, not only the --sample
        if sample is not None:
            table = table.slice(0, sample)
        rows = table.to_pylist()
        if cfg.see_solution:  # a row without its own solution gets the file's or the bundled one (stages/solutions.py)
            rows = with_solutions(rows, load_solutions(cfg.solutions, "hint.solutions"))
        templates = Templates.load(cfg.templates_dir)
        given = cfg
        with tqdm(total=len(rows), desc="hint", unit="problem", disable=not ctx.progress, dynamic_ncols=True) as bar:
            if cfg.llm_judge and cfg.judge_check.enabled:
                bar.set_postfix_str("checking the judge", refresh=True)  # one engine call (its start included) before any shard
            with logging_redirect_tqdm():  # the check's one-line verdict prints above the bar, not through it
                cfg, judge_report = checked_config(cfg, whole, out_dir, templates, backend_factory, executor, describe_backend)
            bar.set_postfix_str("", refresh=True)
            plan = ShardPlan(out_dir / "_shards", "hint", rows, shard_size_for(cfg, len(rows), executor), dataset="hints",
                             owns_folder=True, config={"hint": cfg.semantic(), "prompt_version": templates.version,
                                                       "backend": describe_backend(backend_factory), "schema": SCHEMA_VERSION})
            stats = HintStats()

            def each(shard, res):
                stats.merge(res.record["stats"])
                bar.update(shard.start + len(shard.items) - bar.n)  # what the ticker could not show (a shard done earlier, or run elsewhere)

            with _Ticker(bar) as ticker:
                done = plan.complete(_hint_task, cfg, backend_factory, ticker, executor=executor, each=each)
        computed = done.computed
        run_calls = sum(r.record["stats"]["engine_calls"] for r in computed)
        parts = [conform(pq.read_table(s.path), "hints") for s in plan.shards]  # shards written before the vouch column too
        hints = pa.concat_tables(parts) if parts else HINTS.empty_table()
        write_parquet_atomic(hints, out_dir / "hints.parquet", dataset="hints")
        if judge_report is not None and not judge_report.get("reused"):
            run_calls += judge_report.get("engine_calls", 0)
        stats.extra.update({
            "judge_check": stats_view(judge_report),
            **({"vouch_per_rescued": per_rescued(stats.as_dict())} if cfg.vouch is not None else {}),
            "this_run": {
                "engine_calls": run_calls,
                "shards_computed": len(computed),
                "shards_reused": len(plan.shards) - len(computed),
            },
            # where each shard computed by this run ran, when, and whether its worker had to start an engine for it
            "shard_runs": [r.ran for r in computed],
            "prompt_version": templates.version,
            "backend": describe_backend(backend_factory),
            "config": given.model_dump(mode="json"),
            "inputs": list(inputs.collapsed),
            "sample": sample,
        })
        log.info("hinted %d problems: %d accepted, %d repaired, %d fallback, %d engine calls",
                 stats.problems, stats.accepted, stats.repaired, stats.fallback, stats.engine_calls)
        return stats


STAGE = HINT = HintStage()


__all__ = ["HINT", "STAGE", "HintInputs", "HintStage", "shard_size_for"]
