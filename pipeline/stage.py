"""The stage contract: one `Stage` class, one driver (`run_stage`); counters, stats.json and done markers.

A stage (ingest, mine, hint, build, rollout, rescue, train) is a `Stage` subclass that
declares, once, its ``Inputs`` (what it reads: paths, a sample size) and
``Config`` (its settings: what a workflow file sets and a resume key hashes),
what it owns on disk, whether its output is all or nothing or resumable shards,
whether it needs an engine, and ``run(inputs, cfg, out_dir, ctx) -> Stats``.
It maps its work over shards with ``ctx.executor`` (in this process or on dask:
the stage never knows which; `mentor.pipeline.shards` makes them resumable) and
gets its engine from ``ctx.backend`` when it needs one. The driver does the rest
for every stage alike, and the CLI, the workflow runner and the tests call every
stage the same way::

    stats = run_stage(stage("mine"), {"sources": [...]}, cfg, out_dir, Context(executor=...))
    stats = MINE({"sources": [...]}, cfg, out_dir)        # the same: a stage is callable

(`mentor.stages.stage(name)` looks a stage up by name.) The CLI prints
``stats.as_dict()``; given a resume key (the workflow runner's), the driver also writes
the folder's done marker with the stage's ``summary`` counters once the stage returned.
A round stage declares its place in a workflow round (``round_dir``, ``round_order``,
``round_job``, ``status_columns``), so the runner and `mentor status` know no stage by name. Everything about
a run is a plain file: ``stats.json`` (`write_stats`) beside the outputs,
``_done/<key>.done`` markers.

`Stats` holds counters by name (``rows``) and by reason within a group
(``quarantined["duplicate_key"]``); two of them merge by summing, so per-shard
stats add up to the stage's. A `StatsLayout` declares which counters a stage
reports (so a zero is written as 0, not left out), its derived figures (a rate,
a group's total) and its settings-like values (``round``, ``mode``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol

from pydantic import BaseModel, BeforeValidator, ValidationError

from mentor.pipeline.errors import MentorError, config_error
from mentor.pipeline.executor import LOCAL, Executor
from mentor.pipeline.faults import fault_point
from mentor.pipeline.io import read_json, write_json_atomic
from mentor.pipeline.llm import release_engines
from mentor.pipeline.outdir import Owns, check_output_dir, staged_output_dir

if TYPE_CHECKING:
    from mentor.pipeline.llm import Backend

STATS_FILE = "stats.json"

# A file, folder or glob a stage's Inputs name: a str, or any path object (kept as its str).
Source = Annotated[str, BeforeValidator(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v)]


@dataclass(frozen=True)
class StatsLayout:
    """What a stage counts; calling the layout makes an empty `Stats`.

    - ``counters``: names always reported (0 until added to);
    - ``groups``: counters by reason; a group maps to the reasons always
      reported (an empty tuple: only the reasons that occurred, sorted);
    - ``values``: settings-like entries with their defaults (set, not summed);
    - ``ratios``: ``name -> (numerator, denominator)``, rounded to 6 places;
    - ``totals``: ``name -> group``, the sum over the group's reasons;
    - ``warnings``: whether ``as_dict`` lists the warnings;
    - ``logger``: the logger `Stats.warn` logs to (the stage's module).
    """

    counters: tuple[str, ...] = ()
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    ratios: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    totals: Mapping[str, str] = field(default_factory=dict)
    warnings: bool = False
    logger: str = "mentor"

    def __call__(self, **values: Any) -> "Stats":
        return Stats(self, **values)


class Stats:
    """A stage's counters: ``stats.rows += n``, ``stats.add("quarantined", reason="duplicate_key")``.

    Attribute access reads and sets the counters, groups (a `Counter` per group)
    and values the layout declares; any other name is an AttributeError, so a
    misspelt counter fails loudly instead of counting nowhere.
    """

    def __init__(self, layout: StatsLayout, **values: Any) -> None:
        unknown = sorted(set(values) - set(layout.values))
        if unknown:
            raise TypeError(f"unknown stats value(s) {unknown}")
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "_counts", dict.fromkeys(layout.counters, 0))
        object.__setattr__(self, "_groups", {g: Counter() for g in layout.groups})
        object.__setattr__(self, "_values", dict(layout.values) | values)
        object.__setattr__(self, "warnings", [])
        object.__setattr__(self, "extra", {})  # stats.json entries beside the counters (inputs, config, ...)

    # ------------------------------------------------------------------ access

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("__"):  # (pickle and copy probe dunders before __dict__ is filled)
            for store in ("_counts", "_groups", "_values"):
                d = self.__dict__.get(store, {})
                if name in d:
                    return d[name]
        raise AttributeError(f"stats have no counter {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._counts:
            self._counts[name] = int(value)
        elif name in self._groups:
            self._groups[name] = Counter(value)
        elif name in self._values:
            self._values[name] = value
        else:
            raise AttributeError(f"stats have no counter {name!r}")

    def add(self, name: str, n: int = 1, reason: str | None = None) -> None:
        """Add `n` to counter `name`, or to `reason` within group `name`."""
        if reason is None:
            self._counts[name] += int(n)
        elif n:  # a reason is listed once it occurred (or when the layout fixes the group's reasons)
            self._groups[name][reason] += int(n)

    def warn(self, message: str) -> None:
        """Record a warning (listed in stats.json where the layout says so) and log it."""
        logging.getLogger(self.layout.logger).warning("%s", message)
        self.warnings.append(message)

    # ------------------------------------------------------------------ merging

    def merge(self, other: "Stats | Mapping[str, Any]") -> "Stats":
        """Add `other`'s counters and groups to these (a `Stats` or its ``as_dict()``); returns self.

        Values are kept (they describe the run, not a shard); warnings are appended.
        """
        if isinstance(other, Stats):
            counts, groups, warnings = other._counts, other._groups, other.warnings
        else:
            counts = {k: v for k, v in other.items() if k in self._counts}
            groups = {k: v for k, v in other.items() if k in self._groups and isinstance(v, Mapping)}
            warnings = []
        for name, n in counts.items():
            self._counts[name] = self._counts.get(name, 0) + int(n)
        for name, reasons in groups.items():
            self._groups.setdefault(name, Counter()).update({r: int(n) for r, n in reasons.items()})
        self.warnings.extend(warnings)
        return self

    def __iadd__(self, other: "Stats | Mapping[str, Any]") -> "Stats":
        return self.merge(other)

    # ------------------------------------------------------------------ reporting

    def as_dict(self) -> dict[str, Any]:
        """The stats.json content: counters, groups, derived figures and values."""
        out: dict[str, Any] = dict(self._counts)
        for name, reasons in self._groups.items():
            fixed = self.layout.groups.get(name, ())
            out[name] = {r: reasons.get(r, 0) for r in fixed} if fixed else dict(sorted(reasons.items()))
        for name, (num, den) in self.layout.ratios.items():
            d = self._counts.get(den, 0)
            out[name] = round(self._counts.get(num, 0) / d, 6) if d else 0.0
        for name, group in self.layout.totals.items():
            out[name] = sum(self._groups[group].values())
        out.update(self._values)
        if self.layout.warnings:
            out["warnings"] = list(self.warnings)
        return out

    def __repr__(self) -> str:
        return f"Stats({self.as_dict()!r})"


def write_stats(folder: str | Path, stats: Stats | Mapping[str, Any], **extra: Any) -> Path:
    """``folder/stats.json``: the stats (with ``stats.extra`` and `extra` entries beside them), written atomically."""
    body = stats.as_dict() | stats.extra if isinstance(stats, Stats) else dict(stats)
    return write_json_atomic(body | extra, Path(folder) / STATS_FILE)


def write_done(path: str | Path, key: str, **info: Any) -> Path:
    """A done marker at `path` for work keyed `key`: written last, after every output it vouches for."""
    return write_json_atomic(info | {"key": key, "finished": time.time()}, path)


def read_done(path: str | Path, key: str | None = None) -> dict[str, Any] | None:
    """The marker's content when it exists, parses, and (if given) carries `key`; else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        marker = read_json(path)
    except ValueError:  # cut short or edited: the work is simply redone
        return None
    if not isinstance(marker, dict) or (key is not None and marker.get("key") != key):
        return None
    return marker


def counts(stats: Stats, names: Iterable[str]) -> dict[str, Any]:
    """A few entries of ``stats.as_dict()`` (what a done marker or a status line shows)."""
    d = stats.as_dict()
    return {n: d.get(n) for n in names}


# --------------------------------------------------------------------------- the stage shape


@dataclass
class Context:
    """What a stage gets besides its inputs and config: where its tasks run, its engine, progress bars.

    ``backend`` is a picklable factory of the LLM backend (`mentor.pipeline.llm`),
    for the stages that generate (hint, rollout, rescue); a dask worker calls it
    once and keeps the engine. ``executor``: this process unless given.
    """

    executor: Executor = LOCAL
    backend: "Callable[[], Backend] | None" = None
    progress: bool = False

    def engine(self, stage: str) -> "Callable[[], Backend]":
        if self.backend is None:
            raise TypeError(f"the {stage} stage needs an LLM backend (Context.backend)")
        return self.backend


class Stage:
    """One stage, one class: what it reads (``Inputs``), its settings (``Config``), what it owns on disk, and `run`.

    A subclass declares, once:

    - ``name``, ``Inputs`` and ``Config`` (pydantic models; a workflow section or a
      command's options are a ``Config``);
    - ``owns``: what it writes in its output folder (`mentor.pipeline.outdir.Owns`);
    - ``staged``: True when the output is all or nothing (written into a fresh folder
      swapped in at the end); False when the stage resumes from shards it keeps under
      its output folder (`mentor.pipeline.shards`: done markers inside it);
    - ``needs_engine``: whether it generates (its engines are released when it ends,
      however it ends, so the next stage, a trainer, finds the memory free);
    - ``summary``: the counters a done marker and a status line show;

    ``plan(inputs, cfg, out_dir) -> inputs``: the checks that come before any output is
    touched (settings with the command's flag names, sources outside the output
    folder), returning the inputs as `run` reads them (sources resolved to files);
    and ``run(inputs, cfg, out_dir, ctx) -> Stats``, which writes its outputs into
    `out_dir` (the staging folder when ``staged``) and returns its `Stats`; entries of
    stats.json besides the counters go in ``stats.extra``. The driver (`run_stage`, or
    calling the stage: ``MINE({"sources": [...]}, cfg, out_dir)``) does the rest the
    same way for every stage: the models validated, the output staged or not,
    stats.json written, engines released.
    """

    name: ClassVar[str]
    Inputs: ClassVar[type[BaseModel]]
    Config: ClassVar[type[BaseModel]]
    owns: ClassVar[Owns]
    staged: ClassVar[bool] = True
    needs_engine: ClassVar[bool] = False
    summary: ClassVar[tuple[str, ...]] = ()
    # In a workflow round (`mentor run`): the folder it writes in ``round-NNN/`` (None: not a round stage),
    # its place in the round (ascending), and the columns `mentor status` shows (column -> the stats.json
    # entries it reads, the first present wins).
    round_dir: ClassVar[str | None] = None
    round_order: ClassVar[int | None] = None
    feeds_next_round: ClassVar[bool] = False  # its folder is what the next round's trainer trains on (build; and
    # then ``base_job(rnd)``, like `round_job`, makes what round 0 trains on without logs: the unhinted base prompts)
    status_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def round_job(self, rnd: "Round") -> "RoundJob":
        """What this stage reads in round ``rnd.index`` of a run: its resume key's config and upstream tokens, the
        inputs, config and context `run_stage` gets (a round stage declares it)."""
        raise NotImplementedError(f"the {self.name} stage is not a round stage (no round_job)")

    def status(self, folder: Any) -> dict[str, Any]:
        """The `mentor status` columns of this stage's folder in a round (a `mentor.pipeline.rundir.StageDir`;
        default: `status_columns` from its stats.json)."""
        stats = folder.stats()
        return {col: next((stats[k] for k in keys if stats.get(k) is not None), None)
                for col, keys in self.status_columns.items()}

    def status_note(self, row: Mapping[str, Any]) -> str | None:
        """A line `mentor status` prints below its table for this stage's `row` (``round``, ``state`` and its
        `status` columns), or None."""
        return None

    def plan(self, inputs: Any, cfg: Any, out_dir: Path) -> Any:
        return inputs

    def run(self, inputs: Any, cfg: Any, out_dir: Path, ctx: Context) -> Stats:
        raise NotImplementedError

    def __call__(self, inputs: BaseModel | Mapping[str, Any], cfg: BaseModel | Mapping[str, Any],
                 out_dir: str | Path, ctx: Context | None = None) -> Stats:
        return run_stage(self, inputs, cfg, out_dir, ctx)

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


@dataclass
class RoundJob:
    """One stage of a round as the stage declares it (`Stage.round_job`): what its resume key hashes (``key``: its
    config; ``upstream``: the tokens of what it reads, so a change there re-runs it) and what `run_stage` gets."""

    key: Any
    inputs: Mapping[str, Any]
    cfg: Any
    ctx: Context = field(default_factory=Context)
    upstream: list[str] = field(default_factory=list)


class Round(Protocol):
    """What the workflow runner tells a round stage (`Stage.round_job`) about the round it runs in."""

    index: int  # the round
    workflow: Any  # the run's workflow (`mentor.workflows.config.Workflow`)
    run_dir: Any  # the run directory (`mentor.pipeline.rundir.RunDir`)
    tokens: Mapping[str, str]  # the tokens (resume key + output fingerprint) of this round's earlier stages
    base_token: str  # the token of the base problems
    problems_path: Path  # the base problems, as one PROBLEMS Parquet in the run directory
    progress: bool

    def executor(self, resources: Any = None) -> Executor: ...
    def token(self, folder: Any, key: str) -> str: ...
    def initial_sources(self) -> list[str]: ...
    def initial_token(self) -> str: ...
    def prompts(self) -> tuple[Path, str]: ...  # what this round's trainer trains on, with its token
    def build_settings(self) -> dict: ...


def run_stage(stage: Stage, inputs: BaseModel | Mapping[str, Any], cfg: BaseModel | Mapping[str, Any],
              out_dir: str | Path, ctx: Context | None = None, key: str | None = None) -> Stats:
    """Run `stage` the one way every caller does: models validated (a mapping is parsed), the stage's
    checks (`Stage.plan`), its output all or nothing (``stage.staged``) or resumable, stats.json
    written, engines released; `Stats` back.

    With a resume `key` (the workflow runner's), the driver also keeps the folder's bookkeeping
    (`mentor.pipeline.rundir.StageDir`): older done markers and a killed run's temporaries removed and
    ``_running.json`` written before the stage starts, ``_failed.json`` when it fails, and last, after
    every output, the done marker ``_done/<key>.done`` with the stage's `summary` counters and the
    fingerprint of its data outputs."""
    if key is None:
        return _run(stage, inputs, cfg, Path(out_dir), ctx)
    from mentor.pipeline.rundir import StageDir, outputs_fingerprint  # (rundir builds on this module)

    folder = StageDir(Path(out_dir), stage.name)
    folder.begin(key)
    try:
        stats = _run(stage, inputs, cfg, folder.path, ctx)
    except BaseException as exc:
        folder.fail(str(exc) if isinstance(exc, MentorError) else f"{type(exc).__name__}: {exc}")
        raise
    fault_point(f"{stage.name}.before_marker")
    folder.finish(key, counts(stats, stage.summary) | {"fingerprint": outputs_fingerprint(folder.path)})
    return stats


def _run(stage: Stage, inputs: BaseModel | Mapping[str, Any], cfg: BaseModel | Mapping[str, Any],
         out_dir: Path, ctx: Context | None) -> Stats:
    try:
        if not isinstance(inputs, stage.Inputs):
            inputs = stage.Inputs.model_validate(inputs if isinstance(inputs, Mapping) else inputs.model_dump())
        if not isinstance(cfg, stage.Config):
            cfg = stage.Config.model_validate(cfg if isinstance(cfg, Mapping) else cfg.model_dump())
    except ValidationError as exc:  # one line naming the field, as a workflow file's or a command's error does
        raise config_error(exc, f"{stage.name} settings") from exc
    ctx = ctx or Context()
    try:
        if stage.staged:
            check_output_dir(out_dir)  # before any work: a folder that cannot be replaced is refused first
        inputs = stage.plan(inputs, cfg, out_dir)
        if stage.staged:
            with staged_output_dir(out_dir, stage.name, stage.owns) as staging:
                stats = stage.run(inputs, cfg, staging, ctx)
                write_stats(staging, stats)
        else:
            stats = stage.run(inputs, cfg, out_dir, ctx)
            write_stats(out_dir, stats)
    finally:
        if stage.needs_engine:
            release_engines(ctx.executor)  # here and on every worker: the next stage (a trainer) gets the memory
    return stats


__all__ = ["STATS_FILE", "Context", "Round", "RoundJob", "Source", "Stage", "Stats", "StatsLayout", "counts", "read_done", "run_stage",
           "write_done", "write_stats"]
