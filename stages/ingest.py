"""Ingest: rollout logs in several formats -> canonical rollout Parquet shards.

One reader per format turns a source file into a pyarrow table of canonical
columns; `clean_rollouts` then applies the row-level checks shared with
`mine` (counted quarantine, never a silent drop); each source file becomes one
output shard ``part-NNNNN.parquet`` written atomically.

Formats
-------
``canonical``      our own Parquet shards
``verl``           verl ``trainer.rollout_data_dir`` dumps (``{step}.jsonl``)
``openrlhf``       the JSONL records our reward files append (schemas.OPENRLHF_RECORD_FIELDS)
``gsm8k-example``  openai/grade-school-math ``example_model_solutions.jsonl``
``jsonl``          any JSONL/Parquet with a column mapping (``--map canonical=source``)
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import (
    outside_output,
    read_parquet_schema,
    resolve_inputs,
    write_parquet_atomic,
)
from mentor.pipeline.outdir import check_output_dir, staged_output_dir
from mentor.pipeline.prompts import HINT_PREFIX, INSTRUCTION_SEPARATOR, INSTRUCTIONS
from mentor.pipeline.stage import Stats, StatsLayout, write_stats
from mentor.pipeline.schemas import (
    DOMAINS,
    OPENRLHF_RECORD_FIELDS,
    ROLLOUTS,
    SCHEMA_VERSION,
    check_schema,
    conform,
)

log = logging.getLogger(__name__)

FORMATS = ("auto", "canonical", "verl", "openrlhf", "gsm8k-example", "jsonl")
GSM8K_MODELS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
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


# --------------------------------------------------------------------------- JSONL reading


def iter_jsonl(path: Path, stats: Stats | None = None) -> Iterator[tuple[int, dict | None, str | None]]:
    """Yield (line number, record or None, problem) for each non-blank line.

    Non-UTF-8 bytes, a JSON array instead of JSON Lines and values nested deeper than
    Python's parser goes are fatal errors naming the file and line (with the fix); a
    UTF-8 byte order mark is skipped; a line that is not a JSON object is reported as a
    problem so the caller can quarantine it (a killed writer leaves one). A lone
    UTF-16 surrogate escaped in a string (``"\\ud800"``: valid JSON that UTF-8 cannot
    hold) becomes U+FFFD, counted in ``stats.text_repaired``.
    """
    opener = open
    if path.suffix == ".gz":
        import gzip

        opener = gzip.open  # type: ignore[assignment]
    first = True
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark (Windows editors write one)
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from exc
            if first and text.lstrip().startswith("["):
                raise DataError(
                    f"{path}:{lineno}: a JSON array, not JSON Lines (one object per line); "
                    "convert it, e.g. jq -c '.[]' FILE > FILE.jsonl"
                )
            first = False
            try:
                rec = json.loads(text)
            except json.JSONDecodeError:
                yield lineno, None, "bad_json_line"
                continue
            except RecursionError:
                raise DataError(
                    f"{path}:{lineno}: JSON nested too deeply to read; a rollout record is an object of "
                    "plain values: fix the writer or remove the line"
                ) from None
            if not isinstance(rec, dict):
                yield lineno, None, "bad_json_line"
                continue
            if "\\ud" in text or "\\uD" in text:
                fixed = _no_surrogates(rec)
                if fixed is not rec:
                    rec = fixed
                    if stats is not None:
                        stats.text_repaired += 1
            yield lineno, rec, None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(value):
    """`value` with lone surrogates in its strings (keys too) replaced by U+FFFD; the same object when it has none."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, list):
        items = [_no_surrogates(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value)) else value
    if isinstance(value, dict):
        items = {_no_surrogates(k): _no_surrogates(v) for k, v in value.items()}
        changed = any(k2 is not k or items[k2] is not v for (k, v), k2 in zip(value.items(), items))
        return items if changed else value
    return value


def _check_file(path: Path) -> None:
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); re-create it or remove it from the inputs")


# --------------------------------------------------------------------------- format sniffing


def sniff_format(path: Path) -> str:
    """Guess the format of one source file from its columns."""
    if path.suffix == ".parquet":
        schema = read_parquet_schema(path)
        if not check_schema(schema, "rollouts"):
            return "canonical"
        _sniff_keys(set(schema.names), path)  # a clear error when nothing fits
        return "jsonl"  # a Parquet log of another layout: the mapped reader (verl/openrlhf/gsm8k logs are JSONL)
    _check_file(path)
    for _, rec, _problem in iter_jsonl(path):
        if rec is not None:
            return _sniff_keys(set(rec), path)
    raise DataError(f"{path}: no JSON record found; is it a rollout log?")


def _sniff_keys(keys: set[str], path: Path) -> str:
    if set(GSM8K_MODELS) & keys and "question" in keys:
        return "gsm8k-example"
    if {"input", "output", "score"} <= keys:
        return "verl"
    if set(OPENRLHF_RECORD_FIELDS) <= keys:
        return "openrlhf"
    raise ConfigError(
        f"{path}: cannot tell the format from its columns ({', '.join(sorted(keys)[:12])}); "
        "pass --format jsonl with --map canonical=column (e.g. --map correct=is_right)"
    )


# --------------------------------------------------------------------------- field checks

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _index(v) -> int | None:
    """A round / sample_idx as an int in [0, 2^31), or None when it is not one.

    JSON has one number type, so an integral float (``2.0``) is accepted; ``0.9``,
    ``"0"``, ``true``, ``2**40`` and ``1e10`` are not (never truncated or wrapped).
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v <= INT32_MAX else None
    if isinstance(v, float) and v.is_integer() and 0 <= v <= INT32_MAX:
        return int(v)
    return None


def _step(v) -> int | None:
    """An optional step counter; anything but an integer in int64 range is unknown (null)."""
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if -INT64_MAX <= v <= INT64_MAX else None


def _problem_id(v) -> tuple[str | None, str | None]:
    """(id, quarantine reason): a non-blank string or an integer; null/blank is missing, other types invalid."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None, "problem_id_missing"
    if isinstance(v, str):
        return v, None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v), None
    return None, "problem_id_invalid"


class _Quarantine(Exception):
    """One record cannot be used; the reason is counted."""

    def __init__(self, reason: str):
        self.reason = reason


def _rows_of(path: Path, stats: Stats, records: Iterator, make) -> list[dict]:
    """`make(lineno, rec)` for every record: rows kept, bad JSON lines and `_Quarantine`s counted."""
    rows = []
    for lineno, rec, problem in records:
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        try:
            row = make(lineno, rec)
        except _Quarantine as q:
            stats.quarantined[q.reason] += 1
            continue
        except RecursionError:
            raise DataError(f"{path}:{lineno}: a value nested too deeply to store; flatten it or remove the line") from None
        if row is not None:
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- readers


def _table(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in ROLLOUTS}
    return pa.Table.from_pydict(cols, schema=pa.schema([f.with_nullable(True) for f in ROLLOUTS]))


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
                    "response": _text(sample.get("solution")),
                    "correct": _number(ok),
                    "reward": _number(ok),
                    "domain": domain,
                    "label": answer,
                    "source": f"gsm8k-example:{model}",
                }
            )
    return _table(rows)


def read_verl(path: Path, round_: int, domain: str, stats: Stats, seen: Counter | None = None) -> pa.Table:
    """verl dump rows; `seen` numbers samples per problem across all files of one ingest."""
    seen = Counter() if seen is None else seen
    m = re.match(r"^(\d+)", path.stem)
    file_step = int(m.group(1)) if m else None

    def make(lineno: int, rec: dict) -> dict:
        prompt, output = rec.get("input"), rec.get("output")
        if not isinstance(prompt, str) or not isinstance(output, str):
            raise DataError(f"{path}:{lineno}: column 'input' or 'output' missing or not text; is this a verl rollout dump?")
        correct = rec["acc"] if "acc" in rec else rec.get("score")
        pid = text_id(prompt)
        idx = seen[pid]  # sample_idx is unique per problem within the round, across steps and files
        seen[pid] += 1
        return {
            "problem_id": pid,
            "round": round_,
            "sample_idx": idx,
            "problem": None,
            "prompt": prompt,
            "response": output,
            "correct": _number(correct),
            "reward": _number(rec.get("score")),
            "domain": domain,
            "label": _text(rec.get("gts")),
            "source": "verl",
            "step": _step(rec.get("step", file_step)),
        }

    return _table(_rows_of(path, stats, iter_jsonl(path, stats), make))


def read_openrlhf(path: Path, round_: int | None, domain: str, stats: Stats, seen: Counter | None = None) -> pa.Table:
    """Our reward files' records; a torn last line (killed writer) is quarantined.

    `seen` numbers samples per (problem, round) across all files of one ingest: the
    trainer's processes each write their own file, and one problem's samples may be
    spread over several of them.
    """

    def make(lineno: int, rec: dict) -> dict:
        missing = [k for k in OPENRLHF_RECORD_FIELDS if k not in rec]
        if missing:
            raise _Quarantine("record_missing_fields")
        pid, why = _problem_id(rec["problem_id"])
        if why:
            raise _Quarantine(why)
        rnd = round_ if round_ is not None else _index(rec["round"])
        if rnd is None:
            raise _Quarantine("round_invalid")
        if rec["prompt"] is None:
            raise _Quarantine("prompt_missing")  # the prompt as sent is what the record is about
        order = (_step(rec.get("pid")) or 0, _step(rec.get("seq")) if _step(rec.get("seq")) is not None else lineno)
        return {
            "problem_id": pid,
            "round": rnd,
            "sample_idx": None,  # assigned below, per problem in (pid, seq) order
            "problem": _text(rec.get("problem")),
            "prompt": _text(rec["prompt"]),
            "response": _text(rec["response"]),
            "correct": _number(rec["correct"]),
            "reward": _number(rec["reward"]),
            "hint_id": _text(rec.get("hint_id")),
            "domain": _text(rec.get("domain")) or domain,
            "label": _text(rec.get("label")),
            "source": f"{_text(rec.get('trainer')) or 'openrlhf'}:{path.name}",
            "truncated": rec.get("truncated") if isinstance(rec.get("truncated"), bool) else None,
            "step": _step(rec.get("step")),
            "_order": order,
        }

    rows = _rows_of(path, stats, iter_jsonl(path, stats), make)
    rows.sort(key=lambda r: (r["problem_id"], r["round"], r["_order"]))
    counter: Counter = Counter() if seen is None else seen
    for r in rows:
        key = (r["problem_id"], r["round"])
        r["sample_idx"] = counter[key]
        counter[key] += 1
    return _table(rows)


def read_jsonl_mapped(path: Path, round_: int, domain: str, mapping: dict[str, str], stats: Stats) -> pa.Table:
    """Generic JSONL or Parquet with `mapping` canonical -> source column."""
    if path.suffix == ".parquet":
        df = pl.read_parquet(path)
        records: Iterator = ((i, r, None) for i, r in enumerate(df.iter_rows(named=True), start=1))
        keys = set(df.columns)
    else:
        _check_file(path)
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
        problem_text = _text(get("problem"))
        prompt = _text(get("prompt")) or problem_text
        if pid_col in rec or "problem_id" in mapping:
            # A log with an id column: a null or blank id is missing, never derived from the text.
            pid, why = _problem_id(rec.get(pid_col))
            if why:
                raise _Quarantine(why)
        elif prompt is None:
            raise _Quarantine("prompt_missing")
        else:
            pid = text_id(problem_text or prompt)
        raw_round = get("round")
        rnd = round_ if raw_round is None else _index(raw_round)
        if rnd is None:
            raise _Quarantine("round_invalid")
        raw_idx = get("sample_idx")
        if raw_idx is None:
            idx = counter[pid]
            counter[pid] += 1
        else:
            idx = _index(raw_idx)
            if idx is None:
                raise _Quarantine("sample_idx_invalid")
        truncated = get("truncated")
        return {
            "problem_id": pid,
            "round": rnd,
            "sample_idx": idx,
            "problem": problem_text,
            "prompt": prompt,
            "response": _text(get("response")),
            "correct": _number(get("correct")),
            "reward": _number(get("reward")),
            "hint_id": _text(get("hint_id")),
            "domain": _text(get("domain")) or domain,
            "label": _text(get("label")),
            "source": f"jsonl:{path.name}",
            "truncated": truncated if isinstance(truncated, bool) else None,
            "step": _step(get("step")),
        }

    rows = _rows_of(path, stats, records, make)
    if not checked:
        raise DataError(f"{path}: no JSON record found")
    return _table(rows)


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


def _number(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int) and abs(v) > 2**1000:
        return math.inf if v > 0 else -math.inf  # beyond float: out of range, never an OverflowError
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        if v.strip().lower() in ("true", "false"):
            return float(v.strip().lower() == "true")  # a bool written as text by some loggers
        try:
            return float(v)
        except ValueError:
            return math.nan  # not a number: quarantined as correct_missing
    return None


def _text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True)


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


# --------------------------------------------------------------------------- driver


def ingest(
    sources: list[str],
    out_dir: str | Path,
    fmt: str = "auto",
    round_: int | None = None,
    domain: str = "math",
    mapping: dict[str, str] | None = None,
    problems: str | None = None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> Stats:
    """Convert `sources` into ``out_dir/part-NNNNN.parquet`` + ``out_dir/stats.json``.

    All or nothing: the shards are written into a fresh folder beside `out_dir`
    and swapped in only when every source was read, so an error (or a kill)
    leaves `out_dir` as it was.

    Where a log has only the prompt as sent (OpenRLHF, verl), the original
    problem text is filled by problem_id from `problems` (a PROBLEMS dataset or a
    bundled name: gsm8k, math500, humaneval), else from the base set of the run
    the logs lie in, else from a bundled set holding those ids, else recovered
    from the prompt (chat template, mentor's ``Hint:`` block and the default
    instruction removed). What is left is counted as ``problem_missing``.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if domain not in DOMAINS:
        raise ConfigError(f"unknown --domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    check_mapping(mapping or {})
    if max_response_bytes < 1:
        raise ConfigError(f"--max-response-bytes {max_response_bytes}: must be at least 1")
    if round_ is not None and not 0 <= round_ <= INT32_MAX:
        raise ConfigError(f"--round {round_}: must be in [0, {INT32_MAX}]")
    suffixes = (".parquet",) if fmt == "canonical" else (".jsonl", ".json", ".jsonl.gz", ".parquet")
    paths = outside_output(resolve_inputs(sources, suffixes=suffixes), sources, out_dir)
    # mentor's own bookkeeping beside data (an earlier ingest's stats.json, a reward config) is not a log
    named = {os.path.abspath(s) for s in sources}
    paths = [p for p in paths if p.name not in _BOOKKEEPING or os.path.abspath(p) in named]
    check_output_dir(Path(out_dir))
    stats = INGEST_STATS(format=fmt)
    chosen = {p: (sniff_format(p) if fmt == "auto" else fmt) for p in paths}
    kinds = sorted(set(chosen.values()))
    stats.format = ",".join(kinds)
    if fmt == "auto":
        log.warning("ingest --format auto: detected %s", stats.format)
    texts = _problem_texts(problems) if problems else _run_base_texts(paths)
    default_round = 0 if round_ is None else round_
    shards: list[str] = []
    ids: set[str] = set()
    seen_keys: set[tuple[str, int, int]] = set()
    verl_counter: Counter = Counter()
    openrlhf_counter: Counter = Counter()
    recovery = _Recovery(texts)
    with staged_output_dir(out_dir, "ingest", _owned) as staging:
        for i, path in enumerate(paths):
            kind = chosen[path]
            stats.files += 1
            if kind != "canonical":
                _check_file(path)
            if kind in ("verl", "openrlhf", "gsm8k-example") and path.suffix == ".parquet":
                raise DataError(f"{path}: a Parquet file, but --format {kind} logs are JSONL; "
                                "pass --format jsonl with --map canonical=column (e.g. --map prompt=input --map response=output)")
            if kind == "canonical":
                table = read_canonical(path, round_, stats)
            elif kind == "gsm8k-example":
                table = read_gsm8k_example(path, default_round, domain, stats)
            elif kind == "verl":
                table = read_verl(path, default_round, domain, stats, verl_counter)
            elif kind == "openrlhf":
                table = read_openrlhf(path, round_, domain, stats, openrlhf_counter)
            else:
                table = read_jsonl_mapped(path, default_round, domain, mapping or {}, stats)
            table = recovery.by_id(table)
            table = clean_rollouts(table, stats, max_response_bytes, str(path))
            table = _drop_cross_shard_duplicates(table, seen_keys, stats)
            table = recovery.from_prompt(table, stats, kind)
            if table.num_rows == 0:
                log.warning("%s: no usable rollouts", path)
                continue
            shard = f"part-{i:05d}.parquet"
            write_parquet_atomic(table, staging / shard, dataset="rollouts")
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
        write_stats(staging, stats, schema_version=SCHEMA_VERSION, shards=shards, inputs=[str(p) for p in paths])
    return stats


_BOOKKEEPING = frozenset({"stats.json", "manifest.json", "outcome.json", "config.json", "mentor_reward.json"})
_SHARD_NAME = re.compile(r"^part-\d+\.parquet$|^\..*\.tmp$")


def _owned(name: str) -> bool:
    """What ingest (re)writes in its folder: shards (of earlier runs too), stats.json, temporary files."""
    return name == "stats.json" or bool(_SHARD_NAME.match(name))


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


# --------------------------------------------------------------------------- original problem text


def _problem_texts(problems: str) -> dict[str, str]:
    """problem_id -> problem of a PROBLEMS dataset or a bundled set (gsm8k, math500, humaneval)."""
    from mentor.data import BUNDLED_SETS as BUNDLED
    from mentor.data import bundled
    from mentor.pipeline.io import read_dataset

    if problems in BUNDLED:
        problems = str(bundled(BUNDLED[problems]))
    elif not Path(problems).exists():
        raise ConfigError(f"--problems {problems}: no such file, and not a bundled set ({', '.join(BUNDLED)})")
    df = read_dataset([problems], "problems").select("problem_id", "problem").drop_nulls()
    return dict(df.iter_rows())


def _run_base_texts(paths: list[Path]) -> dict[str, str] | None:
    """The base set of the mentor run directory the logs lie in (runs/<name>/base/problems.parquet), if any."""
    for path in paths[:1]:
        for parent in list(path.resolve().parents)[:6]:
            base = parent / "base" / "problems.parquet"
            if base.is_file() and (parent / "workflow.yaml").is_file():
                log.info("original problem texts from the run's base set %s", base)
                return _problem_texts(str(base))
    return None


class _Recovery:
    """Fills the `problem` column where the log has only the prompt as sent."""

    def __init__(self, texts: dict[str, str] | None):
        self.texts = texts
        self._bundled: dict[str, str] | None = None
        self._cache: dict[tuple, str | None] = {}

    def bundled(self) -> dict[str, str]:
        if self._bundled is None:
            from mentor.data import BUNDLED_SETS as BUNDLED

            self._bundled = {}
            for name in BUNDLED:
                self._bundled.update(_problem_texts(name))
        return self._bundled

    def by_id(self, table: pa.Table) -> pa.Table:
        """Problem texts by problem_id: the given/run's base set first, then the bundled sets."""
        current = table.column("problem").to_pylist()
        if all(c is not None for c in current):
            return table
        pids = table.column("problem_id").to_pylist()
        out = []
        for pid, cur in zip(pids, current):
            if cur is None and pid is not None:
                cur = (self.texts or {}).get(pid)
                if cur is None:
                    cur = self.bundled().get(pid)
            out.append(cur)
        return table.set_column(table.schema.get_field_index("problem"), "problem", pa.array(out, pa.string()))

    def from_prompt(self, table: pa.Table, stats: Stats, kind: str) -> pa.Table:
        """`recover_problem` where the text is still missing; counts recovered and missing rows."""
        current = table.column("problem").to_pylist()
        if all(c is not None for c in current):
            return table
        pids = table.column("problem_id").to_pylist()
        prompts = table.column("prompt").to_pylist()
        hint_ids = table.column("hint_id").to_pylist()
        # Only mentor's own records carry hint_id; verl's and mapped logs' ids may come from the prompt itself.
        ours = kind == "openrlhf"
        out = []
        for pid, cur, prompt, hid in zip(pids, current, prompts, hint_ids):
            if cur is None:
                key = (pid if ours else None, prompt, bool(hid) if ours else None)
                if key not in self._cache:
                    self._cache[key] = recover_problem(prompt, key[0], hid if ours else None, ours)
                cur = self._cache[key]
                if cur is None:
                    stats.problem_missing += 1
                else:
                    stats.problem_recovered += 1
            out.append(cur)
        return table.set_column(table.schema.get_field_index("problem"), "problem", pa.array(out, pa.string()))


_HASH_ID = re.compile(r"^p-[0-9a-f]{16}$")
# The last user turn of common chat templates (ChatML/Qwen/SmolLM, Llama 3, Gemma, Phi, DeepSeek, Mistral, Zephyr).
_USER_TURNS = (
    re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S),
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S),
    re.compile(r"<start_of_turn>user\n(.*?)<end_of_turn>", re.S),
    re.compile(r"<\|user\|>\n?(.*?)(?:<\|end\|>|</s>)", re.S),
    re.compile(r"<｜User｜>(.*?)<｜Assistant｜>", re.S),
    re.compile(r"\[INST\]\s*(.*?)\s*\[/INST\]", re.S),
)
_SPECIAL = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^<>]{1,40}｜>|<start_of_turn>|<end_of_turn>|\[INST\]")
_MAX_PARAGRAPHS = 40


def recover_problem(prompt: str | None, problem_id: str | None = None, hint_id: str | None = None,
                    knows_hint: bool = False) -> str | None:
    """The original problem text inside a prompt as sent, or None when it cannot be told.

    The user turn is taken out of the chat template. For a `problem_id` that is a
    hash of the text (``p-…``, what mentor gives problems without an id) the
    paragraphs whose text has that id are the problem: exact, whatever the
    template. Otherwise mentor's own layout is undone: the ``Hint: …`` block
    before a blank line, then a default instruction at the end. With
    `knows_hint` (the record says whether it was hinted: `hint_id`) a hinted
    prompt without that block, or an unhinted one with it, is not guessed at,
    so an old hint never passes for the problem.
    """
    if not prompt:
        return None
    user = None
    for pattern in _USER_TURNS:
        found = pattern.findall(prompt)
        if found:
            user = found[-1]
            break
    if user is None:
        if _SPECIAL.search(prompt):
            return None  # a chat template this does not know
        user = prompt
    user = user.strip()
    if problem_id is not None and _HASH_ID.match(problem_id):
        paras = user.split("\n\n")[:_MAX_PARAGRAPHS]
        for i in range(len(paras)):
            for j in range(len(paras), i, -1):
                candidate = "\n\n".join(paras[i:j]).strip()
                if candidate and text_id(candidate) == problem_id:
                    return candidate
        if knows_hint or _SPECIAL.search(prompt) or user.startswith(HINT_PREFIX):
            return None  # the id says the text is not in there as written
    before = user.startswith(HINT_PREFIX) and "\n\n" in user
    for instruction in INSTRUCTIONS.values():
        if instruction and user.endswith(INSTRUCTION_SEPARATOR + instruction):
            user = user[: -len(INSTRUCTION_SEPARATOR + instruction)]
            break
    # `mentor build --placement after`: the hint block is the last paragraph, after the problem;
    # `--placement system`: it opens a turn before the user's (the system message).
    after = -1 if before else user.rfind(f"\n\n{HINT_PREFIX} ")
    ahead = prompt[: max(0, prompt.find(user))]
    in_system = not before and after < 0 and re.search(rf"(?:^|\n){re.escape(HINT_PREFIX)} ", ahead) is not None
    if knows_hint and bool(hint_id) != (before or after > 0 or in_system):
        return None  # a hint_id without mentor's hint block (a custom template), or the reverse
    if before:
        user = user.split("\n\n", 1)[1] if "\n\n" in user else ""
    elif after > 0:
        user = user[:after]
    user = user.strip()
    return user or None
