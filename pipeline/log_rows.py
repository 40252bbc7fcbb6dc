"""Reading rollout logs into canonical rows: what every log format's reader shares.

A reader (`mentor ingest`'s formats, `mentor.stages.ingest_formats`, and the formats a trainer declares on
its launcher, ``log_formats``: a `LogFormat`) turns one source file into a pyarrow table of canonical
rollout columns (`mentor.pipeline.schemas.ROLLOUTS`, `rollout_table`): JSON Lines read record by record
(`iter_jsonl`), each record made a row (`rows_of`) or counted in ``stats.quarantined`` by reason
(`Quarantine`), never dropped silently; what makes the whole file unreadable (not UTF-8, a JSON array) is a
`DataError` naming the file, the line and the fix. The field checks (`index_of`, `step_of`,
`problem_id_of`, `number`, `text`) never truncate, wrap or guess.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from mentor.pipeline.errors import DataError
from mentor.pipeline.schemas import ROLLOUTS
from mentor.pipeline.stage import Stats


@dataclass(frozen=True)
class LogFormat:
    """A rollout log format a trainer declares (its launcher's ``log_formats``): ``mentor ingest --format NAME``.

    `keys`: a JSONL record with all of them is of this format (``--format auto``); `read(path, round, domain,
    stats, seen)`: one file as canonical rows (`seen` numbers samples per problem across the files of one ingest)."""

    name: str
    about: str
    keys: frozenset[str]
    read: Callable[[Path, int, str, Stats, Counter], pa.Table]


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



# --------------------------------------------------------------------------- field checks

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def index_of(v) -> int | None:
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


def step_of(v) -> int | None:
    """An optional step counter; anything but an integer in int64 range is unknown (null)."""
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if -INT64_MAX <= v <= INT64_MAX else None


def problem_id_of(v) -> tuple[str | None, str | None]:
    """(id, quarantine reason): a non-blank string or an integer; null/blank is missing, other types invalid."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None, "problem_id_missing"
    if isinstance(v, str):
        return v, None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v), None
    return None, "problem_id_invalid"


class Quarantine(Exception):
    """One record cannot be used; the reason is counted."""

    def __init__(self, reason: str):
        self.reason = reason


def rows_of(path: Path, stats: Stats, records: Iterator, make) -> list[dict]:
    """`make(lineno, rec)` for every record: rows kept, bad JSON lines and `Quarantine`s counted."""
    rows = []
    for lineno, rec, problem in records:
        stats.rows_read += 1
        if rec is None:
            stats.quarantined[problem] += 1
            continue
        try:
            row = make(lineno, rec)
        except Quarantine as q:
            stats.quarantined[q.reason] += 1
            continue
        except RecursionError:
            raise DataError(f"{path}:{lineno}: a value nested too deeply to store; flatten it or remove the line") from None
        if row is not None:
            rows.append(row)
    return rows



def rollout_table(rows: list[dict]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in ROLLOUTS}
    return pa.Table.from_pydict(cols, schema=pa.schema([f.with_nullable(True) for f in ROLLOUTS]))



def number(v) -> float | None:
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



def text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True)


__all__ = ["INT32_MAX", "INT64_MAX", "LogFormat", "Quarantine", "check_not_empty", "index_of", "iter_jsonl",
           "number", "problem_id_of", "rollout_table", "rows_of", "step_of", "text"]
