"""Ingest: rollout logs in several formats -> canonical rollout Parquet shards.

One reader per format (`mentor.stages.ingest_formats`, which lists them) turns
a source file into a pyarrow table of canonical columns; the original problem
text is filled in where the log has only the prompt as sent
(`mentor.stages.ingest_problems`); `clean_rollouts` then applies the row-level
checks shared with `mine` (counted quarantine, never a silent drop); each
source file becomes one output shard ``part-NNNNN.parquet`` written atomically.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Literal

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from mentor.pipeline.errors import DataError
from mentor.pipeline.inputs import outside_output, resolve_inputs
from mentor.pipeline.io import write_parquet_atomic
from mentor.pipeline.outdir import Owns
from mentor.pipeline.stage import Context, Round, RoundJob, Source, Stage, Stats, StatsLayout
from mentor.pipeline.schemas import DOMAINS, RECORDS_FORMAT, SCHEMA_VERSION, conform
from mentor.pipeline.log_rows import INT32_MAX, check_not_empty
from mentor.stages.ingest_formats import (
    check_mapping,
    read_canonical,
    read_gsm8k_example,
    read_jsonl_mapped,
    read_records,
    sniff_format,
    trainer_formats,
)
from mentor.stages.ingest_problems import ProblemRecovery, problem_texts, run_base_texts

log = logging.getLogger(__name__)

# mentor's own formats and the trainers' (their launchers' log_formats, e.g. verl's dumps)
FORMATS = ("auto", "canonical", *trainer_formats(), RECORDS_FORMAT, "gsm8k-example", "jsonl")
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20  # responses above this are clipped (head + tail kept)


INGEST_STATS = StatsLayout(
    counters=(
        "files", "rows_read", "rollouts", "problems", "response_clipped",
        "problem_recovered",  # problem text recovered from the prompt as sent (chat template, hint, instruction removed)
        "problem_missing",  # no original problem text: `mine` falls back to the prompt as sent
        "text_repaired",  # records whose strings held lone surrogates (replaced by U+FFFD)
    ),
    groups={"quarantined": ()},
    totals={"quarantined_total": "quarantined"},
    values={"format": ""},
    logger=__name__,
)


# --------------------------------------------------------------------------- row checks


def clip_text(text: str, max_bytes: int) -> str:
    """Keep the head and, mostly, the tail (where the final answer is) of an oversized text."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    head = max_bytes // 4
    tail = max_bytes - head
    marker = f"\n[... {len(data) - max_bytes} bytes clipped by mentor ...]\n"
    return data[:head].decode("utf-8", "ignore") + marker + data[-tail:].decode("utf-8", "ignore")


def clean_rollouts(table: pa.Table, stats: Stats, max_response_bytes: int, where: str) -> pa.Table:
    """Quarantine rows that cannot be used, clip oversized responses, conform to the schema.

    Reasons: ``problem_id_missing`` (null or blank), ``prompt_missing`` (neither the
    problem nor the prompt text), ``correct_missing`` (null/NaN/not a number),
    ``correct_out_of_range``, ``response_missing``, ``domain_unknown``,
    ``duplicate_key`` (same problem_id, round, sample_idx as an earlier row: the
    first is kept). The readers quarantine what cannot even be stored
    (``round_invalid``, ``sample_idx_invalid``, ``problem_id_invalid``,
    ``record_missing_fields``, ``bad_json_line``).
    """
    df = pl.from_arrow(table)
    reasons = (
        pl.when(pl.col("problem_id").is_null() | (pl.col("problem_id").str.strip_chars() == ""))
        .then(pl.lit("problem_id_missing"))
        .when(pl.col("prompt").is_null() & pl.col("problem").is_null())
        .then(pl.lit("prompt_missing"))
        .when(pl.col("correct").is_null() | pl.col("correct").is_nan())
        .then(pl.lit("correct_missing"))
        .when((pl.col("correct") < 0) | (pl.col("correct") > 1))
        .then(pl.lit("correct_out_of_range"))
        .when(pl.col("response").is_null())
        .then(pl.lit("response_missing"))
        .when(~pl.col("domain").is_in(list(DOMAINS)))
        .then(pl.lit("domain_unknown"))
        .when(~pl.struct("problem_id", "round", "sample_idx").is_first_distinct())
        .then(pl.lit("duplicate_key"))
        .otherwise(None)
    )
    df = df.with_columns(_reason=reasons)
    for reason, n in df.group_by("_reason").len().iter_rows():
        if reason is not None:
            stats.quarantined[reason] += n
            log.warning("%s: %d rows quarantined (%s)", where, n, reason)
    df = df.filter(pl.col("_reason").is_null()).drop("_reason")
    too_big = df.filter(pl.col("response").str.len_bytes() > max_response_bytes).height
    if too_big:
        stats.response_clipped += too_big
        df = df.with_columns(
            pl.when(pl.col("response").str.len_bytes() > max_response_bytes)
            .then(pl.col("response").map_elements(lambda s: clip_text(s, max_response_bytes), return_dtype=pl.String))
            .otherwise(pl.col("response"))
            .alias("response")
        )
    df = df.with_columns(pl.col("prompt").fill_null(pl.col("problem")))
    return conform(df.to_arrow(), "rollouts")


# --------------------------------------------------------------------------- the stage


class IngestInputs(BaseModel):
    """What `mentor ingest` reads: rollout log files, folders or globs."""

    model_config = ConfigDict(extra="forbid")

    sources: list[Source]


class IngestConfig(BaseModel):
    """Settings of `mentor ingest` (its options are generated from these fields)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[FORMATS] = Field(  # type: ignore[valid-type]
        "auto", description="Input format; auto sniffs it from the columns and says which it chose.")
    round: int | None = Field(None, ge=0, le=INT32_MAX, description="Round number to stamp on the rollouts (default: from "
                              "the log, else 0).")
    domain: Literal[DOMAINS] = Field("math", description="Domain when the log does not say.")  # type: ignore[valid-type]
    mapping: dict[str, str] = Field(default_factory=dict, description="Column mapping for format jsonl: canonical -> column.")
    problems: str | None = Field(None, description="Problems to fill the original problem text by problem_id: gsm8k | "
                                 "math500 | humaneval (bundled) or a problems Parquet file/folder.")
    max_response_bytes: int = Field(DEFAULT_MAX_RESPONSE_BYTES, ge=1, le=1 << 40, description="Longer responses are "
                                    "clipped (head and tail kept) and counted.")


class IngestStage(Stage):
    """Convert rollout logs into ``part-NNNNN.parquet`` shards (ROLLOUTS) + ``stats.json``.

    All or nothing: the shards are written into a fresh folder swapped in only when
    every source was read, so an error (or a kill) leaves the output as it was.

    Where a log has only the prompt as sent (OpenRLHF, verl), the original
    problem text is filled by problem_id from ``problems`` (a PROBLEMS dataset or a
    bundled name: gsm8k, math500, humaneval), else from the base set of the run
    the logs lie in, else from a bundled set holding those ids, else recovered
    from the prompt (chat template, mentor's ``Hint:`` block and the default
    instruction removed). What is left is counted as ``problem_missing``.
    """

    name = "ingest"
    Inputs = IngestInputs
    Config = IngestConfig
    owns = Owns(("stats.json",), shards=True)
    summary = ("rollouts", "problems")
    round_dir, round_order = "rollouts", 20
    status_columns = {"rows": ("rollouts",), "problems": ("problems",)}

    def round_job(self, rnd: Round) -> RoundJob:
        wf, r = rnd.workflow, rnd.index
        if r == 0 and wf.initial_rollouts is not None:
            key = {"format": wf.initial_rollouts.format, "map": wf.initial_rollouts.map, "round": r}
            sources = rnd.initial_sources()
        else:
            from mentor.stages.train import section_logs  # not for a bare `mentor ingest`

            # The format and files the trainer section declares (its launcher's log_format, or the train stage's own kind's)
            fmt, sources = section_logs(wf.trainer, rnd.run_dir.stage(r, "train"))
            key = {"format": fmt, "round": r}
        cfg = {"format": key["format"], "round": r, "domain": wf.domain, "mapping": key.get("map") or {},
               "problems": str(rnd.problems_path)}
        return RoundJob(key, {"sources": sources}, cfg, upstream=[rnd.tokens["train"], rnd.base_token])

    def plan(self, inputs: IngestInputs, cfg: IngestConfig, out_dir: Path) -> IngestInputs:
        """The column mapping checked; the log files, outside `out_dir`."""
        check_mapping(cfg.mapping)
        suffixes = (".parquet",) if cfg.format == "canonical" else (".jsonl", ".json", ".jsonl.gz", ".parquet")
        paths = outside_output(resolve_inputs(inputs.sources, suffixes=suffixes), inputs.sources, out_dir)
        # mentor's own bookkeeping beside data (an earlier ingest's stats.json, a reward config) is not a log
        named = {os.path.abspath(s) for s in inputs.sources}
        return IngestInputs(sources=[str(p) for p in paths if p.name not in _BOOKKEEPING or os.path.abspath(p) in named])

    def run(self, inputs: IngestInputs, cfg: IngestConfig, out_dir: Path, ctx: Context) -> Stats:
        fmt, round_, domain, mapping = cfg.format, cfg.round, cfg.domain, cfg.mapping
        paths = [Path(s) for s in inputs.sources]
        stats = INGEST_STATS(format=fmt)
        chosen = {p: (sniff_format(p) if fmt == "auto" else fmt) for p in paths}
        kinds = sorted(set(chosen.values()))
        stats.format = ",".join(kinds)
        if fmt == "auto":
            log.warning("ingest --format auto: detected %s", stats.format)
        texts = problem_texts(cfg.problems) if cfg.problems else run_base_texts(paths)
        default_round = 0 if round_ is None else round_
        shards: list[str] = []
        ids: set[str] = set()
        seen_keys: set[tuple[str, int, int]] = set()
        theirs = trainer_formats()
        seen: dict[str, Counter] = {kind: Counter() for kind in (*theirs, RECORDS_FORMAT)}  # samples numbered per format
        recovery = ProblemRecovery(texts)
        for i, path in enumerate(paths):
            kind = chosen[path]
            stats.files += 1
            if kind != "canonical":
                check_not_empty(path)
            if kind in (*theirs, RECORDS_FORMAT, "gsm8k-example") and path.suffix == ".parquet":
                raise DataError(f"{path}: a Parquet file, but --format {kind} logs are JSONL; "
                                "pass --format jsonl with --map canonical=column (e.g. --map prompt=input --map response=output)")
            if kind == "canonical":
                table = read_canonical(path, round_, stats)
            elif kind == "gsm8k-example":
                table = read_gsm8k_example(path, default_round, domain, stats)
            elif kind in theirs:
                table = theirs[kind].read(path, default_round, domain, stats, seen[kind])
            elif kind == RECORDS_FORMAT:
                table = read_records(path, round_, domain, stats, seen[kind])
            else:
                table = read_jsonl_mapped(path, default_round, domain, mapping, stats)
            table = recovery.by_id(table)
            table = clean_rollouts(table, stats, cfg.max_response_bytes, str(path))
            table = _drop_cross_shard_duplicates(table, seen_keys, stats)
            table = recovery.from_prompt(table, stats, kind)
            if table.num_rows == 0:
                log.warning("%s: no usable rollouts", path)
                continue
            shard = f"part-{i:05d}.parquet"
            write_parquet_atomic(table, out_dir / shard, dataset="rollouts")
            shards.append(shard)
            stats.rollouts += table.num_rows
            ids.update(table.column("problem_id").to_pylist())
        if not shards:
            raise DataError(f"no usable rollouts in {', '.join(map(str, paths))} (quarantined: {dict(stats.quarantined)})")
        stats.problems = len(ids)
        if stats.problem_missing:
            stats.warn(
                f"{stats.problem_missing} of {stats.rollouts} rollouts have no original problem text: `mine` would show "
                "the hint agents the prompt as sent (chat template and any old hint included); "
                "pass --problems gsm8k|math500|humaneval|FILE"
            )
        stats.extra.update(schema_version=SCHEMA_VERSION, shards=shards, inputs=[str(p) for p in paths])
        return stats


STAGE = INGEST = IngestStage()


_BOOKKEEPING = frozenset({"stats.json", "manifest.json", "outcome.json", "config.json", "mentor_reward.json"})


def _drop_cross_shard_duplicates(table: pa.Table, seen: set, stats: Stats) -> pa.Table:
    keys = zip(
        table.column("problem_id").to_pylist(),
        table.column("round").to_pylist(),
        table.column("sample_idx").to_pylist(),
    )
    keep = []
    for k in keys:
        dup = k in seen
        keep.append(not dup)
        if dup:
            stats.quarantined["duplicate_key"] += 1
        else:
            seen.add(k)
    return table if all(keep) else table.filter(pa.array(keep))
