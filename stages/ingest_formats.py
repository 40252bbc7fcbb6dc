"""The rollout log formats `mentor ingest` reads: one reader per format.

Each reader turns one source file into a pyarrow table of canonical rollout
columns (`mentor.pipeline.schemas.ROLLOUTS`). What cannot even be stored (a
line that is not a JSON object, a key out of range, a record missing fields)
is counted in ``stats.quarantined`` by reason, never dropped silently; what
makes the whole file unreadable (not UTF-8, a JSON array) is a `DataError`
naming the file, the line and the fix.

Formats
-------
``canonical``      our own Parquet shards
``verl``           verl ``trainer.rollout_data_dir`` dumps (``{step}.jsonl``)
``openrlhf``       the JSONL records our reward files append (schemas.OPENRLHF_RECORD_FIELDS)
``gsm8k-example``  openai/grade-school-math ``example_model_solutions.jsonl``
``jsonl``          any JSONL/Parquet with a column mapping (``--map canonical=source``)
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import read_parquet_schema
from mentor.pipeline.schemas import OPENRLHF_RECORD_FIELDS, RECORDS_FORMAT, ROLLOUTS, check_schema, conform
from mentor.pipeline.stage import Stats

GSM8K_MODELS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


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


def check_not_empty(path: Path) -> None:
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
    check_not_empty(path)
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
        return RECORDS_FORMAT
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

