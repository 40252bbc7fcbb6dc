"""The rollout log formats `mentor ingest` reads: one reader per format.

Each reader turns one source file into a pyarrow table of canonical rollout
columns (`mentor.pipeline.schemas.ROLLOUTS`), on what every reader shares
(`mentor.pipeline.log_rows`). What cannot even be stored (a line that is not a
JSON object, a key out of range, a record missing fields) is counted in
``stats.quarantined`` by reason, never dropped silently; what makes the whole
file unreadable (not UTF-8, a JSON array) is a `DataError` naming the file, the
line and the fix.

Formats
-------
``canonical``      our own Parquet shards
``openrlhf``       the JSONL records our reward files append (schemas.RECORD_FIELDS)
``gsm8k-example``  openai/grade-school-math ``example_model_solutions.jsonl``
``jsonl``          any JSONL/Parquet with a column mapping (``--map canonical=source``)

and the formats the trainers declare on their launchers (``log_formats``, a `LogFormat` each: its name,
its keys for ``--format auto``, its reader; `trainer_formats`), e.g. a trainer's own rollout dumps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import read_parquet_schema
from mentor.pipeline.log_rows import (
    INT32_MAX,
    LogFormat,
    Quarantine,
    check_not_empty,
    index_of,
    iter_jsonl,
    number,
    problem_id_of,
    rollout_table,
    rows_of,
    step_of,
    text,
)
from mentor.pipeline.schemas import RECORD_FIELDS, RECORDS_FORMAT, ROLLOUTS, check_schema, conform
from mentor.pipeline.stage import Stats
from mentor.training.launcher import get_launcher, trainer_kinds

GSM8K_MODELS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


def trainer_formats() -> dict[str, LogFormat]:
    """The log formats the trainers declare (their launchers' ``log_formats``), by name."""
    return {f.name: f for kind in trainer_kinds() for f in get_launcher(kind).log_formats}


# --------------------------------------------------------------------------- format sniffing


def sniff_format(path: Path) -> str:
    """Guess the format of one source file from its columns."""
    if path.suffix == ".parquet":
        schema = read_parquet_schema(path)
        if not check_schema(schema, "rollouts"):
            return "canonical"
        _sniff_keys(set(schema.names), path)  # a clear error when nothing fits
        return "jsonl"  # a Parquet log of another layout: the mapped reader (the other formats' logs are JSONL)
    check_not_empty(path)
    for _, rec, _problem in iter_jsonl(path):
        if rec is not None:
            return _sniff_keys(set(rec), path)
    raise DataError(f"{path}: no JSON record found; is it a rollout log?")


def _sniff_keys(keys: set[str], path: Path) -> str:
    if set(GSM8K_MODELS) & keys and "question" in keys:
        return "gsm8k-example"
    for fmt in trainer_formats().values():
        if fmt.keys <= keys:
            return fmt.name
    if set(RECORD_FIELDS) <= keys:
        return RECORDS_FORMAT
    raise ConfigError(
        f"{path}: cannot tell the format from its columns ({', '.join(sorted(keys)[:12])}); "
        "pass --format jsonl with --map canonical=column (e.g. --map correct=is_right)"
    )


# --------------------------------------------------------------------------- readers


def read_gsm8k_example(path: Path, round_: int, domain: str, stats: Stats) -> pa.Table:
    rows = []
    for lineno, rec, problem in iter_jsonl(path, stats):
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        question = rec.get("question")
        truth = rec.get("ground_truth")
        if not isinstance(question, str) or not isinstance(truth, str):
            raise DataError(
                f"{path}:{lineno}: column 'question' or 'ground_truth' missing or not text; "
                "this is not the gsm8k-example layout (try --format auto)"
            )
        answer = truth.rsplit("A:", 1)[-1].strip() if "A:" in truth else None
        pid = text_id(question)
        for idx, model in enumerate(GSM8K_MODELS):
            sample = rec.get(model)
            if not isinstance(sample, dict):
                stats.quarantined["sample_missing"] += 1
                continue
            ok = sample.get("is_correct")
            rows.append(
                {
                    "problem_id": pid,
                    "round": round_,
                    "sample_idx": idx,
                    "problem": question,
                    "prompt": question,
                    "response": text(sample.get("solution")),
                    "correct": number(ok),
                    "reward": number(ok),
                    "domain": domain,
                    "label": answer,
                    "source": f"gsm8k-example:{model}",
                }
            )
    return rollout_table(rows)


def read_records(path: Path, round_: int | None, domain: str, stats: Stats, seen: Counter | None = None) -> pa.Table:
    """Our reward files' records; a torn last line (killed writer) is quarantined.

    `seen` numbers samples per (problem, round) across all files of one ingest: the
    trainer's processes each write their own file, and one problem's samples may be
    spread over several of them.
    """

    def make(lineno: int, rec: dict) -> dict:
        missing = [k for k in RECORD_FIELDS if k not in rec]
        if missing:
            raise Quarantine("record_missing_fields")
        pid, why = problem_id_of(rec["problem_id"])
        if why:
            raise Quarantine(why)
        rnd = round_ if round_ is not None else index_of(rec["round"])
        if rnd is None:
            raise Quarantine("round_invalid")
        if rec["prompt"] is None:
            raise Quarantine("prompt_missing")  # the prompt as sent is what the record is about
        order = (step_of(rec.get("pid")) or 0, step_of(rec.get("seq")) if step_of(rec.get("seq")) is not None else lineno)
        return {
            "problem_id": pid,
            "round": rnd,
            "sample_idx": None,  # assigned below, per problem in (pid, seq) order
            "problem": text(rec.get("problem")),
            "prompt": text(rec["prompt"]),
            "response": text(rec["response"]),
            "correct": number(rec["correct"]),
            "reward": number(rec["reward"]),
            "hint_id": text(rec.get("hint_id")),
            "domain": text(rec.get("domain")) or domain,
            "label": text(rec.get("label")),
            "source": f"{text(rec.get('trainer')) or RECORDS_FORMAT}:{path.name}",
            "truncated": rec.get("truncated") if isinstance(rec.get("truncated"), bool) else None,
            "step": step_of(rec.get("step")),
            "_order": order,
        }

    rows = rows_of(path, stats, iter_jsonl(path, stats), make)
    rows.sort(key=lambda r: (r["problem_id"], r["round"], r["_order"]))
    counter: Counter = Counter() if seen is None else seen
    for r in rows:
        key = (r["problem_id"], r["round"])
        r["sample_idx"] = counter[key]
        counter[key] += 1
    return rollout_table(rows)


def read_jsonl_mapped(path: Path, round_: int, domain: str, mapping: dict[str, str], stats: Stats) -> pa.Table:
    """Generic JSONL or Parquet with `mapping` canonical -> source column."""
    if path.suffix == ".parquet":
        df = pl.read_parquet(path)
        records: Iterator = ((i, r, None) for i, r in enumerate(df.iter_rows(named=True), start=1))
        keys = set(df.columns)
    else:
        check_not_empty(path)
        records = iter_jsonl(path, stats)
        keys = None
    counter: Counter = Counter()
    checked = False
    pid_col = mapping.get("problem_id", "problem_id")

    def make(lineno: int, rec: dict) -> dict:
        nonlocal checked
        if not checked:
            _require_mapped(path, set(rec) if keys is None else keys, mapping)
            checked = True
        get = lambda name: rec.get(mapping.get(name, name))  # noqa: E731
        problem_text = text(get("problem"))
        prompt = text(get("prompt")) or problem_text
        if pid_col in rec or "problem_id" in mapping:
            # A log with an id column: a null or blank id is missing, never derived from the text.
            pid, why = problem_id_of(rec.get(pid_col))
            if why:
                raise Quarantine(why)
        elif prompt is None:
            raise Quarantine("prompt_missing")
        else:
            pid = text_id(problem_text or prompt)
        raw_round = get("round")
        rnd = round_ if raw_round is None else index_of(raw_round)
        if rnd is None:
            raise Quarantine("round_invalid")
        raw_idx = get("sample_idx")
        if raw_idx is None:
            idx = counter[pid]
            counter[pid] += 1
        else:
            idx = index_of(raw_idx)
            if idx is None:
                raise Quarantine("sample_idx_invalid")
        truncated = get("truncated")
        return {
            "problem_id": pid,
            "round": rnd,
            "sample_idx": idx,
            "problem": problem_text,
            "prompt": prompt,
            "response": text(get("response")),
            "correct": number(get("correct")),
            "reward": number(get("reward")),
            "hint_id": text(get("hint_id")),
            "domain": text(get("domain")) or domain,
            "label": text(get("label")),
            "source": f"jsonl:{path.name}",
            "truncated": truncated if isinstance(truncated, bool) else None,
            "step": step_of(get("step")),
        }

    rows = rows_of(path, stats, records, make)
    if not checked:
        raise DataError(f"{path}: no JSON record found")
    return rollout_table(rows)


MAPPABLE = tuple(f.name for f in ROLLOUTS if f.name != "source")


def check_mapping(mapping: dict[str, str]) -> None:
    """`--map` names canonical rollout columns only: a typo must not be ignored (an id silently derived instead)."""
    bad = sorted(set(mapping) - set(MAPPABLE))
    if bad:
        raise ConfigError(f"--map {bad[0]}={mapping[bad[0]]}: {bad[0]!r} is not a rollout column; map one of {', '.join(MAPPABLE)}")


def _require_mapped(path: Path, keys: set[str], mapping: dict[str, str]) -> None:
    absent = [(k, v) for k, v in mapping.items() if v not in keys]
    if absent:
        k, v = absent[0]
        raise DataError(f"{path}: column {v!r} (--map {k}={v}) missing (found: {', '.join(sorted(keys)[:12])}); fix the --map")
    need = ["response", "correct"]
    missing = [c for c in need if mapping.get(c, c) not in keys]
    if not ({mapping.get("problem_id", "problem_id"), mapping.get("problem", "problem"), mapping.get("prompt", "prompt")} & keys):
        missing.append("problem_id|problem|prompt")
    if missing:
        shown = ", ".join(f"'{mapping.get(c, c)}'" for c in missing)
        raise DataError(
            f"{path}: column {shown} missing (found: {', '.join(sorted(keys)[:12])}); "
            f"pass --map {missing[0].split('|')[0]}=<your column>"
        )


def read_canonical(path: Path, round_: int | None, stats: Stats) -> pa.Table:
    schema = read_parquet_schema(path)
    problems = check_schema(schema, "rollouts")
    if problems:
        detail = "; ".join(str(p) for p in problems)
        raise DataError(f"{path}: not canonical rollouts: {detail}; use --format jsonl --map ... for other layouts")
    df = pl.read_parquet(path)
    stats.rows_read += df.height
    if round_ is not None:
        df = df.with_columns(pl.lit(round_, pl.Int64).alias("round"))
    # Keys outside int32 (a file written by another tool) are quarantined, never wrapped.
    as_int = {c: pl.col(c).cast(pl.Int64, strict=False) for c in ("round", "sample_idx")}
    key_ok = {c: e.is_not_null() & (e >= 0) & (e <= INT32_MAX) for c, e in as_int.items()}
    bad_round, bad_idx = df.select(
        (~key_ok["round"]).sum().alias("round"), (key_ok["round"] & ~key_ok["sample_idx"]).sum().alias("sample_idx")
    ).row(0)
    if bad_round or bad_idx:
        stats.quarantined["round_invalid"] += int(bad_round)
        stats.quarantined["sample_idx_invalid"] += int(bad_idx)
        df = df.filter(key_ok["round"] & key_ok["sample_idx"])
    return conform(df.to_arrow(), "rollouts")



