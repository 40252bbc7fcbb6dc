"""Mine: find collapsed problems (every valid rollout's raw correctness <= threshold).

Two passes over the rollout shards, each a plain polars query mapped with the
stage's executor (in this process or on dask, the same functions):

1. ``count_part``: one group-by per problem over the small columns (problem_id,
   round, sample_idx, correct): valid rollouts, distinct valid rollouts, max/min
   correctness, the latest round; and the row-level quarantine counters. The
   problems are counted a part at a time (a part = the problems whose id hashes
   to it; `ROWS_PER_PART` rollouts per part), because one group-by over every
   problem of 20M rollouts holds about 2 GB; the parts' results only add up.
2. ``failed_shard``: per shard, the collapsed problems' rollouts in rollout
   order (round newest first, then sample_idx, then the text), reduced to what
   the output needs: each problem's first row (problem text, domain), its first
   labelled row and its first ``k_failed`` distinct non-empty responses.
   Each file is read for the problems pass 1 found in it; `_Assembler` takes
   the shards in order and writes a problem out after the last file holding
   its rollouts, merging the rows of a problem spread over several shards the
   same way; memory holds only the problems still open. The order is defined by content, so the rows do not
   depend on how the rollouts are split into shards; ``collapsed.parquet`` is
   ordered by the shard where each problem's last rollout lies, then by
   problem_id.

The collapse test uses raw correctness (``correct``), never a shaped reward.

The cut is not a collapse. A rollout the trainer cut at its response limit (``truncated``,
which mentor's reward files log: TRL's completion ids, OpenRLHF's missing end-of-turn
token, verl's response counted against ``data.max_response_length``) scores 0 whatever
the policy knew. A collapsed problem where more than ``cut_share`` (default: half) of the
valid rollouts were cut failed mostly at the limit: pass 1 sets it apart (counted
``cut``, listed in ``cut.jsonl`` with its counts), it is not written to
``collapsed.parquet`` and so never hinted; the fix is a longer response limit, which
``mentor status`` and ``mentor inspect`` say. ``collapsed`` still counts every problem
whose rollouts all failed (the collapse rate); ``collapsed - cut`` go on to be hinted.
Rollouts without a ``truncated`` value count as not cut.

Its settings are `mentor.stages.mine_config`; earlier rounds (``--history``: streaks, previous
hints) are `mentor.stages.mine_history`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.executor import LOCAL, Executor
from mentor.pipeline.faults import fault_point
from mentor.pipeline.inputs import outside_output, resolve_inputs
from mentor.pipeline.io import check_dataset_files, parquet_writer_atomic, read_parquet_schema
from mentor.pipeline.outdir import Owns
from mentor.pipeline.stage import Context, Round, RoundJob, Source, Stage, Stats, StatsLayout
from mentor.stages.mine_config import MineConfig
from mentor.stages.mine_history import apply_history, history_frames
from mentor.stages.solutions import load_solutions
from mentor.training.launcher import response_limit_settings

log = logging.getLogger(__name__)


QUARANTINE_REASONS = (
    "problem_id_missing", "round_invalid", "sample_idx_invalid", "correct_missing", "correct_out_of_range", "duplicate_key",
)
MINE_STATS = StatsLayout(
    counters=("rollouts", "problems", "collapsed", "cut", "all_correct", "mixed", "too_few_rollouts", "shards"),
    groups={"quarantined": QUARANTINE_REASONS},
    ratios={"collapse_rate": ("collapsed", "problems"), "cut_share": ("cut", "collapsed")},
    totals={"quarantined_total": "quarantined"},
)
CUT_FILE = "cut.jsonl"
CUT_SCHEMA = {"problem_id": pl.String, "round": pl.Int32, "n_rollouts": pl.Int32, "n_valid": pl.Int32, "n_cut": pl.Int32}
def cut_fix() -> str:  # the advice for problems cut at the response limit: the trainers' settings, from their launchers
    return ("these problems failed mostly at the response limit, not for want of a hint: raise the round's response limit "
            f"({response_limit_settings()}) and train them again")
ROWS_PER_PART = 4_000_000  # rollouts counted per part: the group-by state of ~1M problems

# --------------------------------------------------------------------------- row checks

_INT32_MAX = 2**31 - 1
# A row's key: a problem id (not null, not empty) and round / sample_idx in [0, 2^31).
_PID_OK = pl.col("problem_id").is_not_null() & (pl.col("problem_id").str.len_bytes() > 0)
_ROUND_OK = pl.col("round").is_not_null() & pl.col("round").is_between(0, _INT32_MAX)
_IDX_OK = pl.col("sample_idx").is_not_null() & pl.col("sample_idx").is_between(0, _INT32_MAX)
_KEY_OK = _PID_OK & _ROUND_OK & _IDX_OK
_C = pl.col("correct").cast(pl.Float64)
_NO_VALUE = _C.is_null() | _C.is_nan()
_VALID = _KEY_OK & ~_NO_VALUE & _C.is_between(0, 1)
# One rollout of a problem: (round, sample_idx) as one integer.
_ROLLOUT = pl.col("round").cast(pl.Int64) * (1 << 32) + pl.col("sample_idx").cast(pl.Int64)


def _scan(path: str | list[str], correct_col: str) -> pl.LazyFrame:
    lf = pl.scan_parquet(path)
    if correct_col != "correct":
        lf = lf.drop("correct", strict=False).rename({correct_col: "correct"})
    return lf


def _truncated(lf: pl.LazyFrame) -> pl.Expr:
    """Whether a rollout was cut at the response limit (False where the log does not say)."""
    if "truncated" in lf.collect_schema().names():
        return pl.col("truncated").cast(pl.Boolean).fill_null(False)
    return pl.lit(False)


# --------------------------------------------------------------------------- pass 1: counts


def count_part(part: int, files: list[str], cfg: MineConfig, parts: int = 1) -> dict:
    """Counts of the problems in `part` (of `parts`) over every file.

    Returns ``collapsed`` (per collapsed problem: latest_round, n_valid, n_rollouts and
    the first and last file holding its rollouts), ``kinds`` (problems per kind,
    distinct and duplicate rollouts) and ``rows`` (the row-level quarantine counters).
    """
    scans = [_scan(f, cfg.correct_col) for f in files]
    rows = pl.concat(
        [lf.select("problem_id", "round", "sample_idx", "correct", _cut=_truncated(lf), _file=pl.lit(i, pl.Int32))
         for i, lf in enumerate(scans)]
    )
    if parts > 1:  # every row, a null or empty id too, hashes to exactly one part
        rows = rows.filter(pl.col("problem_id").hash() % parts == part)
    per = (
        rows.filter(_PID_OK)
        .group_by("problem_id")
        .agg(
            n_valid=_VALID.sum(),
            n_rollouts=pl.when(_VALID).then(_ROLLOUT).drop_nulls().unique().len(),
            max_c=pl.when(_VALID).then(_C).max(),
            min_c=pl.when(_VALID).then(_C).min(),
            round=pl.when(_VALID).then(pl.col("round")).max(),
            n_cut=(_VALID & pl.col("_cut")).sum(),
            first_file=pl.col("_file").min(),
            last_file=pl.col("_file").max(),
        )
        .with_columns(
            kind=pl.when(pl.col("n_rollouts") < cfg.min_rollouts)
            .then(pl.lit("too_few_rollouts"))
            .when((pl.col("max_c") <= cfg.threshold) & (pl.col("n_cut") > cfg.cut_share * pl.col("n_valid")))
            .then(pl.lit("cut"))
            .when(pl.col("max_c") <= cfg.threshold)
            .then(pl.lit("collapsed"))
            .when(pl.col("min_c") >= 1.0)
            .then(pl.lit("all_correct"))
            .otherwise(pl.lit("mixed"))
        )
    )
    collapsed = per.filter(pl.col("kind") == "collapsed").select(
        "problem_id", pl.col("round").cast(pl.Int32).alias("latest_round"), "n_valid", "n_rollouts", "first_file", "last_file"
    )
    cut = per.filter(pl.col("kind") == "cut").select(
        "problem_id", pl.col("round").cast(pl.Int32), pl.col("n_rollouts").cast(pl.Int32), pl.col("n_valid").cast(pl.Int32),
        pl.col("n_cut").cast(pl.Int32))
    kinds = per.select(
        problems=pl.len(),
        rollouts=pl.col("n_rollouts").sum(),
        duplicate_key=(pl.col("n_valid") - pl.col("n_rollouts")).sum(),
        cut=(pl.col("kind") == "cut").sum(),
        collapsed=pl.col("kind").is_in(["collapsed", "cut"]).sum(),
        **{k: (pl.col("kind") == k).sum() for k in ("all_correct", "mixed", "too_few_rollouts")},
    )
    quarantine = rows.select(
        problem_id_missing=(~_PID_OK).sum(),
        round_invalid=(_PID_OK & ~_ROUND_OK).sum(),
        sample_idx_invalid=(_PID_OK & _ROUND_OK & ~_IDX_OK).sum(),
        correct_missing=(_KEY_OK & _NO_VALUE).sum(),
        correct_out_of_range=(_KEY_OK & ~_NO_VALUE & ~_C.is_between(0, 1)).sum(),
    )
    # One scan of the part feeds all four (polars shares the common subplan).
    collapsed, cut, kinds, quarantine = pl.collect_all([collapsed, cut, kinds, quarantine], engine="streaming")
    return {"collapsed": collapsed, "cut": cut, "kinds": kinds.row(0, named=True), "rows": quarantine.row(0, named=True)}


def _add_counts(stats: Stats, part: dict) -> None:
    kinds = part["kinds"]
    for name in ("problems", "rollouts", "collapsed", "cut", "all_correct", "mixed", "too_few_rollouts"):
        stats.add(name, kinds[name] or 0)
    stats.add("quarantined", kinds["duplicate_key"] or 0, reason="duplicate_key")
    for reason, n in part["rows"].items():
        stats.add("quarantined", n or 0, reason=reason)


# --------------------------------------------------------------------------- pass 2: failed responses


def truncate_keep_end_expr(text: pl.Expr, budget: int) -> pl.Expr:
    """Cut `text` to about `budget` chars: a short head for the approach, mostly the tail for the answer."""
    head = budget // 5
    tail = budget - head
    cut = pl.concat_str(
        [text.str.slice(0, head).str.strip_chars_end(), pl.lit(" [...] "), text.str.slice(-tail).str.strip_chars_start()]
    )
    return pl.when(text.str.len_chars() <= budget).then(text).otherwise(cut)


def truncate_keep_end(text: str, budget: int) -> str:
    """`truncate_keep_end_expr` on one string."""
    return pl.select(truncate_keep_end_expr(pl.lit(text, dtype=pl.String), budget)).item()


# Rollout order: newest round first, then sample_idx; equal keys (duplicate rows) by their text's
# hash (`_h`, of the stripped text), so the order is defined by content, not by file order.
_ORDER = ["problem_id", "round", "sample_idx", "_h"]
_DESCENDING = [False, True, False, False]


def _reduce(rows: pl.DataFrame, k: int) -> pl.DataFrame:
    """What the output needs of `rows`: per problem, in rollout order, its first row and its first
    labelled row (``_pick`` false), then its first `k` distinct non-empty responses (``_pick`` true).

    Reducing the union of two reduced parts gives the rows of reducing all their rows at once,
    so a problem spread over several shards is reduced shard by shard, then once more. The
    order and the choice are made on the key columns; only the chosen rows are copied.
    """
    keys = rows.select(*_ORDER, "_empty", _row=pl.int_range(pl.len()), _labelled=pl.col("label").is_not_null())
    keys = keys.sort(_ORDER, descending=_DESCENDING, nulls_last=True, maintain_order=True)
    info = keys.filter(
        pl.col("problem_id").is_first_distinct() | (pl.col("_labelled") & pl.struct("problem_id", "_labelled").is_first_distinct())
    )
    picks = (
        keys.filter(~pl.col("_empty") & pl.struct("problem_id", "_h").is_first_distinct())
        .group_by("problem_id", maintain_order=True)
        .head(k)
        if k
        else keys.clear()  # (polars' head(0) per group gives a null row per group)
    )
    return pl.concat([rows[info["_row"]].with_columns(_pick=pl.lit(False)), rows[picks["_row"]].with_columns(_pick=pl.lit(True))])


def failed_shard(task: tuple[str, pl.DataFrame], cfg: MineConfig) -> dict[str, pl.DataFrame]:
    """What one shard holds of the collapsed problems; `task` is (path, the problem_id of the
    collapsed problems with rollouts in that file).

    Returns ``seen`` (per problem: its valid rollouts in this shard) and ``rows`` (`_reduce`d).
    """
    path, collapsed = task
    lf = _scan(path, cfg.correct_col)
    names = set(lf.collect_schema().names())

    def optional(name: str) -> pl.Expr:
        return pl.col(name) if name in names else pl.lit(None, dtype=pl.String).alias(name)

    problem = optional("problem")
    if "problem" not in names or _has_nulls(path, "problem"):
        problem = problem.fill_null(pl.col("prompt"))  # the prompt as sent, where the log has no problem text

    stripped = pl.col("response").str.strip_chars()
    rows = (
        lf.filter(_VALID & (_C <= cfg.threshold))
        .join(collapsed.lazy(), on="problem_id", how="semi")
        .select(
            "problem_id",
            pl.col("round").cast(pl.Int32),
            pl.col("sample_idx").cast(pl.Int32),
            "domain",
            optional("label"),
            problem.alias("problem"),
            "response",
            _h=stripped.hash(),
            _empty=stripped == "",
        )
        .collect(engine="streaming")
    )
    return {"seen": rows.group_by("problem_id").len("m"), "rows": _reduce(rows, cfg.k_failed)}


def _has_nulls(path: str, column: str) -> bool:
    """Whether `column` of the Parquet file may hold nulls (its statistics say so, or say nothing)."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.names.index(column)
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            return True
    return False


class _Assembler:
    """Takes the shards' results in shard order; returns each problem's row after the last file that holds it."""

    def __init__(self, collapsed: pl.DataFrame, cfg: MineConfig, where: str = "rollouts"):
        self.need = collapsed  # problem_id, latest_round, n_valid, n_rollouts, first_file, last_file
        self.cfg = cfg
        self.where = where
        self.seen: pl.DataFrame | None = None  # the open problems' rollouts seen so far
        self.rows: pl.DataFrame | None = None  # ... and their reduced rows

    def add(self, index: int, part: dict[str, pl.DataFrame]) -> pl.DataFrame | None:
        """Take file `index`'s result; return the rows of the problems whose last file it is (or None)."""
        seen, rows = part["seen"], part["rows"]
        merged = self.seen is not None
        if merged:  # problems continued from earlier shards
            seen = pl.concat([self.seen, seen]).group_by("problem_id").agg(pl.col("m").sum())
            rows = pl.concat([self.rows, rows])
        done = self.need.filter(pl.col("last_file") == index)
        changed = done.join(seen, on="problem_id", how="left").filter(pl.col("m").fill_null(0) != pl.col("n_valid"))
        if changed.height:  # every valid rollout of a collapsed problem failed: pass 2 must see n_valid of them
            raise DataError(
                f"{self.where}: the rollouts changed while mining (problem {changed['problem_id'][0]!r}: "
                f"{changed['n_valid'][0]} valid rollouts counted, {changed['m'].fill_null(0)[0]} found again); "
                "mine a snapshot that is not being written"
            )
        if done.height == seen.height:  # the usual case: no problem continues in a later shard
            self.seen = self.rows = None
        else:
            ids = done.select("problem_id")
            self.seen = seen.join(ids, on="problem_id", how="anti")
            self.rows = rows.join(ids, on="problem_id", how="anti")
            rows = rows.join(ids, on="problem_id", how="semi")
        if not done.height:
            return None
        return self._output(rows, done, merged)

    def _output(self, rows: pl.DataFrame, done: pl.DataFrame, merged: bool) -> pl.DataFrame:
        if merged:  # some problems' rows come from several shards
            rows = _reduce(rows, self.cfg.k_failed)
        # Per problem: its first row comes first, then its first labelled one, then the picks in order.
        per = (
            rows.with_columns(truncate_keep_end_expr(pl.col("response"), self.cfg.failed_budget_chars))
            .group_by("problem_id", maintain_order=True)
            .agg(
                pl.col("problem").first(),
                pl.col("domain").first(),
                pl.col("label").drop_nulls().first(),
                failed=pl.col("response").filter(pl.col("_pick")),
            )
        )
        for col, fix in (("problem", "re-ingest the logs with --problems (or give the rollouts a prompt)"),
                         ("domain", "set the domain column (math or code), e.g. re-ingest with --domain")):
            bad = per.filter(pl.col(col).is_null())
            if bad.height:
                ids = bad.get_column("problem_id").head(3).to_list()
                raise DataError(f"{self.where}: collapsed problem(s) {ids} have no {col} text in any rollout; {fix}")
        return (
            done.select("problem_id", pl.col("latest_round").alias("round"), pl.col("n_rollouts").cast(pl.Int32))
            .join(per, on="problem_id", how="left")
            .select("problem_id", "round", "domain", "problem", "label", "n_rollouts", "failed")
            .sort("problem_id")
        )


# --------------------------------------------------------------------------- driver


@dataclass
class Mined:
    """The counts of a mining run, and its collapsed rows as a stream of sorted chunks."""

    stats: Stats
    chunks: Iterator[pl.DataFrame]
    cut: pl.DataFrame | None = None  # the collapsed problems set apart as cut at the response limit (CUT_SCHEMA)


def _check_correct_col(paths: list[Path], cfg: MineConfig) -> None:
    if cfg.correct_col == "correct":
        return
    for p in paths:
        schema = read_parquet_schema(p)
        if cfg.correct_col not in schema.names:
            raise ConfigError(f"{p}: column {cfg.correct_col!r} (--correct-col) missing; found {schema.names}")
        found = schema.field(cfg.correct_col).type
        if not (pa.types.is_integer(found) or pa.types.is_floating(found) or pa.types.is_boolean(found)):
            textual = pa.types.is_string(found) or pa.types.is_large_string(found) or pa.types.is_string_view(found)
            raise DataError(
                f"{p}: column {cfg.correct_col!r} (--correct-col) has type {'string' if textual else found}; "
                "correctness must be a number "
                "in [0, 1] (or a bool): pass a numeric column, or re-ingest with --map correct=<column>"
            )


def mine_iter(sources: Sequence[str], cfg: MineConfig, history: Sequence[str] = (), executor: Executor = LOCAL) -> Mined:
    """Count (pass 1) now; return the stats and an iterator over the collapsed rows (schema: collapsed)."""
    paths = resolve_inputs(sources)
    check_dataset_files(paths, "rollouts")
    _check_correct_col(paths, cfg)
    files = [str(p) for p in paths]
    stats = MINE_STATS()
    stats.shards = len(files)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    parts = max(1, -(-rows // ROWS_PER_PART))
    collapsed, cut = [], []
    for part in executor.imap(count_part, range(parts), files, cfg, parts):
        _add_counts(stats, part)
        collapsed.append(part["collapsed"])
        cut.append(part["cut"])
    log.info("counted %d problems, %d collapsed (%d of them cut at the response limit: not hinted)",
             stats.problems, stats.collapsed, stats.cut)
    past = history_frames(history) if history else (None, None)
    sols = load_solutions(cfg.solutions, "--solutions")
    solutions = pl.DataFrame({"problem_id": list(sols), "solution": list(sols.values())},
                             schema={"problem_id": pl.String, "solution": pl.String})
    cut_rows = pl.concat(cut).sort("problem_id")
    return Mined(stats, _chunks(files, pl.concat(collapsed), cfg, past, executor, solutions), cut_rows)


def _write_cut(cut: pl.DataFrame, path: Path) -> None:
    """One JSON line per problem set apart as cut (a temporary name, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    cut.write_ndjson(tmp)
    os.replace(tmp, path)


def _chunks(files: list[str], collapsed: pl.DataFrame, cfg: MineConfig, history, executor: Executor,
            solutions: pl.DataFrame | None = None) -> Iterator[pl.DataFrame]:
    if not collapsed.height:
        return
    where = files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more)"
    assembler = _Assembler(collapsed, cfg, where)
    # Each file is read for the collapsed problems whose rollouts lie in it (pass 1 noted their first and last file).
    tasks = ((f, collapsed.filter(pl.col("first_file") <= i, pl.col("last_file") >= i).select("problem_id"))
             for i, f in enumerate(files))
    for index, part in enumerate(executor.imap(failed_shard, tasks, cfg)):
        rows = assembler.add(index, part)
        del part  # (a shard's rows are large: free them before the next shard is read)
        if rows is not None:
            chunk = apply_history(rows, history)
            if solutions is not None:
                chunk = chunk.join(solutions, on="problem_id", how="left", maintain_order="left")
            del rows
            yield chunk
            del chunk


class MineInputs(BaseModel):
    """What `mentor mine` reads: canonical rollout shards, and earlier rounds' collapsed/hints files."""

    model_config = ConfigDict(extra="forbid")

    sources: list[Source]
    history: list[Source] = Field(default_factory=list)


class MineStage(Stage):
    """The stage: mine rollout shards into ``collapsed.parquet`` (streamed), ``cut.jsonl`` (the collapsed problems
    set apart as cut at the response limit; not Parquet, so a reader of the folder's Parquet sees only collapsed rows) and ``stats.json``.

    Both are written into a fresh folder swapped in at the end: a kill or an error
    leaves the old pair or the new one.
    """

    name = "mine"
    Inputs = MineInputs
    Config = MineConfig
    owns = Owns(("collapsed.parquet", CUT_FILE, "stats.json"))
    summary = ("collapsed", "problems")
    round_dir, round_order = "collapsed", 30
    status_columns = {"rows": ("collapsed",), "problems": ("problems",), "collapse_rate": ("collapse_rate",),
                      "cut": ("cut",), "cut_share": ("cut_share",)}

    def round_job(self, rnd: Round) -> RoundJob:
        """The round's rollouts, with earlier rounds' collapsed and hints outputs as history (their tokens upstream)."""
        history, tokens = [], []
        for j in range(rnd.index):
            for sd, name in ((rnd.run_dir.stage(j, self), "collapsed.parquet"), (rnd.run_dir.stage(j, "hint"), "hints.parquet")):
                key = sd.done_key()
                if (sd.path / name).exists() and key:
                    history.append(str(sd.path / name))
                    tokens.append(rnd.token(sd, key))
        return RoundJob(rnd.workflow.mine, {"sources": [str(rnd.run_dir.stage(rnd.index, "ingest").path)], "history": history},
                        rnd.workflow.mine, Context(executor=rnd.executor()), upstream=[rnd.tokens["ingest"], *tokens])

    def status_note(self, row) -> str | None:
        cut, share = row.get("cut"), row.get("cut_share")
        if not (isinstance(cut, int) and cut > 0):
            return None
        share = f"{share:.4f}" if isinstance(share, float) else "-" if share is None else share
        return (f"round {row['round']}: {cut} of {row.get('rows')} collapsed problems ({share}) failed mostly at the "
                f"response limit and are not hinted; raise the round's response limit ({response_limit_settings()})")

    def plan(self, inputs: MineInputs, cfg: MineConfig, out_dir: Path) -> MineInputs:
        sources = [str(f) for f in outside_output(resolve_inputs(inputs.sources), inputs.sources, out_dir)]
        return inputs.model_copy(update={"sources": sources})

    def run(self, inputs: MineInputs, cfg: MineConfig, out_dir: Path, ctx: Context) -> Stats:
        mined = mine_iter(inputs.sources, cfg, inputs.history, ctx.executor)
        with parquet_writer_atomic(out_dir / "collapsed.parquet", "collapsed") as write:
            for chunk in mined.chunks:
                write(chunk)
                del chunk  # (before the next shard is read)
        fault_point("mine.after_collapsed")
        _write_cut(mined.cut if mined.cut is not None else pl.DataFrame(schema=CUT_SCHEMA), out_dir / CUT_FILE)
        if mined.stats.cut:
            mined.stats.extra["cut_fix"] = cut_fix()
        mined.stats.extra["config"] = cfg.model_dump()
        return mined.stats


STAGE = MINE = MineStage()


__all__ = ["MINE", "MINE_STATS", "STAGE", "MineConfig", "MineInputs", "MineStage", "count_part", "failed_shard", "mine_iter",
           "truncate_keep_end"]
