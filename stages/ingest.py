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
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.ids import text_id
from mentor.pipeline.io import (
    read_parquet_schema,
    resolve_inputs,
    write_json_atomic,
    write_parquet_atomic,
)
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


@dataclass
class IngestStats:
    files: int = 0
    rows_read: int = 0
    rollouts: int = 0
    problems: int = 0
    response_clipped: int = 0
    quarantined: Counter = field(default_factory=Counter)
    format: str = ""

    def as_dict(self) -> dict:
        return {
            "format": self.format,
            "files": self.files,
            "rows_read": self.rows_read,
            "rollouts": self.rollouts,
            "problems": self.problems,
            "response_clipped": self.response_clipped,
            "quarantined": dict(sorted(self.quarantined.items())),
            "quarantined_total": sum(self.quarantined.values()),
        }


# --------------------------------------------------------------------------- JSONL reading


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """Yield (line number, record or None, problem) for each non-blank line.

    Non-UTF-8 bytes are a fatal error naming the file and line (the fix is to
    re-encode the file); a line that is not a JSON object is reported as a
    problem so the caller can quarantine it (a killed writer leaves one).
    """
    opener = open
    if path.suffix == ".gz":
        import gzip

        opener = gzip.open  # type: ignore[assignment]
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start}); "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from exc
            try:
                rec = json.loads(text)
            except json.JSONDecodeError:
                yield lineno, None, "bad_json_line"
                continue
            if not isinstance(rec, dict):
                yield lineno, None, "bad_json_line"
                continue
            yield lineno, rec, None


def _check_file(path: Path) -> None:
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (0 bytes); re-create it or remove it from the inputs")


# --------------------------------------------------------------------------- format sniffing


def sniff_format(path: Path) -> str:
    """Guess the format of one source file from its columns."""
    if path.suffix == ".parquet":
        names = set(read_parquet_schema(path).names)
        if not check_schema(read_parquet_schema(path), "rollouts"):
            return "canonical"
        return _sniff_keys(names, path)
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


# --------------------------------------------------------------------------- readers


def _table(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in ROLLOUTS}
    return pa.Table.from_pydict(cols, schema=pa.schema([f.with_nullable(True) for f in ROLLOUTS]))


def read_gsm8k_example(path: Path, round_: int, domain: str, stats: IngestStats) -> pa.Table:
    rows = []
    for lineno, rec, problem in iter_jsonl(path):
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
                    "response": sample.get("solution"),
                    "correct": _number(ok),
                    "reward": _number(ok),
                    "domain": domain,
                    "label": answer,
                    "source": f"gsm8k-example:{model}",
                }
            )
    return _table(rows)


def read_verl(path: Path, round_: int, domain: str, stats: IngestStats, seen: Counter | None = None) -> pa.Table:
    """verl dump rows; `seen` numbers samples per problem across all files of one ingest."""
    rows = []
    seen = Counter() if seen is None else seen
    m = re.match(r"^(\d+)", path.stem)
    file_step = int(m.group(1)) if m else None
    for lineno, rec, problem in iter_jsonl(path):
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        prompt, output = rec.get("input"), rec.get("output")
        if not isinstance(prompt, str) or not isinstance(output, str):
            raise DataError(f"{path}:{lineno}: column 'input' or 'output' missing or not text; is this a verl rollout dump?")
        correct = rec["acc"] if "acc" in rec else rec.get("score")
        pid = text_id(prompt)
        step = rec.get("step", file_step)
        key = pid  # sample_idx is unique per problem within the round, across steps and files
        rows.append(
            {
                "problem_id": pid,
                "round": round_,
                "sample_idx": seen[key],
                "problem": None,
                "prompt": prompt,
                "response": output,
                "correct": _number(correct),
                "reward": _number(rec.get("score")),
                "domain": domain,
                "label": _text(rec.get("gts")),
                "source": "verl",
                "step": step if isinstance(step, int) else None,
            }
        )
        seen[key] += 1
    return _table(rows)


def read_openrlhf(path: Path, round_: int | None, domain: str, stats: IngestStats) -> pa.Table:
    """Our reward files' records; a torn last line (killed writer) is quarantined."""
    rows = []
    for lineno, rec, problem in iter_jsonl(path):
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        missing = [k for k in OPENRLHF_RECORD_FIELDS if k not in rec]
        if missing:
            stats.quarantined["record_missing_fields"] += 1
            continue
        rows.append(
            {
                "problem_id": str(rec["problem_id"]),
                "round": round_ if round_ is not None else rec["round"],
                "sample_idx": None,  # assigned below, per problem in (pid, seq) order
                "problem": rec.get("problem"),
                "prompt": rec["prompt"],
                "response": rec["response"],
                "correct": _number(rec["correct"]),
                "reward": _number(rec["reward"]),
                "hint_id": rec.get("hint_id"),
                "domain": rec.get("domain") or domain,
                "label": _text(rec.get("label")),
                "source": f"{rec.get('trainer', 'openrlhf')}:{path.name}",
                "truncated": rec.get("truncated"),
                "step": rec.get("step"),
                "_order": (rec.get("pid", 0), rec.get("seq", lineno)),
            }
        )
    rows.sort(key=lambda r: (r["problem_id"], r["round"], r["_order"]))
    counter: Counter = Counter()
    for r in rows:
        key = (r["problem_id"], r["round"])
        r["sample_idx"] = counter[key]
        counter[key] += 1
    return _table(rows)


def read_jsonl_mapped(path: Path, round_: int, domain: str, mapping: dict[str, str], stats: IngestStats) -> pa.Table:
    """Generic JSONL or Parquet with `mapping` canonical -> source column."""
    if path.suffix == ".parquet":
        df = pl.read_parquet(path)
        records: Iterator = ((i, r, None) for i, r in enumerate(df.iter_rows(named=True), start=1))
        keys = set(df.columns)
    else:
        _check_file(path)
        records = iter_jsonl(path)
        keys = None
    rows = []
    counter: Counter = Counter()
    checked = False
    for lineno, rec, problem in records:
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        if not checked:
            _require_mapped(path, set(rec) if keys is None else keys, mapping)
            checked = True
        get = lambda name: rec.get(mapping.get(name, name))  # noqa: E731
        problem_text = get("problem")
        prompt = get("prompt") or problem_text
        pid = get("problem_id")
        pid = str(pid) if pid is not None else text_id(problem_text or prompt)
        rnd = get("round")
        idx = get("sample_idx")
        if idx is None:
            idx = counter[pid]
            counter[pid] += 1
        rows.append(
            {
                "problem_id": pid,
                "round": int(rnd) if isinstance(rnd, int) else round_,
                "sample_idx": int(idx),
                "problem": _text(problem_text),
                "prompt": _text(prompt),
                "response": _text(get("response")),
                "correct": _number(get("correct")),
                "reward": _number(get("reward")),
                "hint_id": _text(get("hint_id")),
                "domain": _text(get("domain")) or domain,
                "label": _text(get("label")),
                "source": f"jsonl:{path.name}",
                "truncated": get("truncated") if isinstance(get("truncated"), bool) else None,
                "step": get("step") if isinstance(get("step"), int) else None,
            }
        )
    if not checked:
        raise DataError(f"{path}: no JSON record found")
    return _table(rows)


def _require_mapped(path: Path, keys: set[str], mapping: dict[str, str]) -> None:
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


def read_canonical(path: Path, round_: int | None, stats: IngestStats) -> pa.Table:
    schema = read_parquet_schema(path)
    problems = check_schema(schema, "rollouts")
    if problems:
        detail = "; ".join(str(p) for p in problems)
        raise DataError(f"{path}: not canonical rollouts: {detail}; use --format jsonl --map ... for other layouts")
    table = conform(pq.read_table(path), "rollouts")
    stats.rows_read += table.num_rows
    if round_ is not None:
        table = table.set_column(table.schema.get_field_index("round"), "round", pa.array([round_] * table.num_rows, pa.int32()))
    return table


def _number(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
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


def clean_rollouts(table: pa.Table, stats: IngestStats, max_response_bytes: int, where: str) -> pa.Table:
    """Quarantine rows that cannot be used, clip oversized responses, conform to the schema.

    Reasons: ``correct_missing`` (null/NaN/not a number), ``correct_out_of_range``,
    ``problem_id_missing``, ``response_missing``, ``duplicate_key`` (same problem_id,
    round, sample_idx as an earlier row: the first is kept), ``domain_unknown``.
    """
    df = pl.from_arrow(table)
    reasons = (
        pl.when(pl.col("problem_id").is_null())
        .then(pl.lit("problem_id_missing"))
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
) -> IngestStats:
    """Convert `sources` into ``out_dir/part-NNNNN.parquet`` + ``out_dir/stats.json``.

    `problems` (a PROBLEMS dataset) fills the original problem text by
    problem_id where the log only has the prompt as sent (OpenRLHF/verl).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if domain not in DOMAINS:
        raise ConfigError(f"unknown --domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    suffixes = (".parquet",) if fmt == "canonical" else (".jsonl", ".json", ".jsonl.gz", ".parquet")
    paths = resolve_inputs(sources, suffixes=suffixes)
    out_dir = Path(out_dir)
    stats = IngestStats(format=fmt)
    chosen = {p: (sniff_format(p) if fmt == "auto" else fmt) for p in paths}
    kinds = sorted(set(chosen.values()))
    stats.format = ",".join(kinds)
    if fmt == "auto":
        log.warning("ingest --format auto: detected %s", stats.format)
    texts = _problem_texts(problems) if problems else None
    default_round = 0 if round_ is None else round_
    shards: list[Path] = []
    ids: set[str] = set()
    seen_keys: set[tuple[str, int, int]] = set()
    verl_counter: Counter = Counter()
    for i, path in enumerate(paths):
        kind = chosen[path]
        stats.files += 1
        if kind != "canonical":
            _check_file(path)
        if kind == "canonical":
            table = read_canonical(path, round_, stats)
        elif kind == "gsm8k-example":
            table = read_gsm8k_example(path, default_round, domain, stats)
        elif kind == "verl":
            table = read_verl(path, default_round, domain, stats, verl_counter)
        elif kind == "openrlhf":
            table = read_openrlhf(path, round_, domain, stats)
        else:
            table = read_jsonl_mapped(path, default_round, domain, mapping or {}, stats)
        if texts is not None:
            table = _fill_problem(table, texts)
        table = clean_rollouts(table, stats, max_response_bytes, str(path))
        table = _drop_cross_shard_duplicates(table, seen_keys, stats)
        if table.num_rows == 0:
            log.warning("%s: no usable rollouts", path)
            continue
        shard = out_dir / f"part-{i:05d}.parquet"
        write_parquet_atomic(table, shard, dataset="rollouts")
        shards.append(shard)
        stats.rollouts += table.num_rows
        ids.update(table.column("problem_id").to_pylist())
    if not shards:
        raise DataError(f"no usable rollouts in {', '.join(map(str, paths))} (quarantined: {dict(stats.quarantined)})")
    stats.problems = len(ids)
    # Shards left by an earlier run over more inputs would be read as part of this dataset.
    for stale in sorted(set(out_dir.glob("part-*.parquet")) - set(shards)):
        log.warning("removing stale shard %s from an earlier run", stale)
        stale.unlink()
    out = stats.as_dict() | {"schema_version": SCHEMA_VERSION, "shards": [s.name for s in shards], "inputs": [str(p) for p in paths]}
    write_json_atomic(out, out_dir / "stats.json")
    return stats


def _drop_cross_shard_duplicates(table: pa.Table, seen: set, stats: IngestStats) -> pa.Table:
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


def _problem_texts(problems: str) -> dict[str, str]:
    from mentor.pipeline.io import read_dataset

    df = read_dataset([problems], "problems").select("problem_id", "problem")
    return dict(df.iter_rows())


def _fill_problem(table: pa.Table, texts: dict[str, str]) -> pa.Table:
    pids = table.column("problem_id").to_pylist()
    current = table.column("problem").to_pylist()
    filled = [c if c is not None else texts.get(p) for p, c in zip(pids, current)]
    return table.set_column(table.schema.get_field_index("problem"), "problem", pa.array(filled, pa.string()))
