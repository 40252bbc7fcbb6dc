"""Reference solutions: where they come from, how the collapsed set carries them, how the agents read them.

A worked reference solution lets the hint agents do what SAGE's and HiLL's hinters do:
Attribution compares the failed attempts with it, Generation and Repair take the hint
from it (its first step the attempts miss, never further), Judgment checks the hint's
claims against it, and the judge check's known-good hints are its first step.

Sources, by problem id: a ``solution`` column of the collapsed set (`mentor mine
--solutions`, or a base set with a solution column), else a file (Parquet / JSONL with
``problem_id`` and ``solution``; a problems set with a ``solution`` column is one), else
the bundled solutions of GSM8K (worked answers), MATH-500 (its ``solution``) and
HumanEval (``canonical_solution``), converted by `mentor.data.convert_solutions`.
DeepMath-103K: map one of its ``r1_solution_*`` columns to ``solution`` in the base set.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import polars as pl

from mentor.data import bundled
from mentor.data.convert_solutions import SOLUTION_FILES
from mentor.pipeline.errors import ConfigError, DataError

_CALC = re.compile(r"<<[^>]*>>")


@lru_cache(maxsize=1)
def _bundled() -> tuple[tuple[str, str], ...]:
    rows: list[tuple[str, str]] = []
    for name in SOLUTION_FILES:
        try:
            rows += pl.read_parquet(bundled(name)).select("problem_id", "solution").drop_nulls().rows()
        except FileNotFoundError:
            continue
    return tuple(rows)


def load_solutions(path: str | None, what: str = "judge_check.solutions") -> dict[str, str]:
    """problem_id -> reference solution, from `path` (Parquet or JSONL) or, when None, the bundled solutions."""
    if path is None:
        return dict(_bundled())
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: {what} file not found; give a Parquet or JSONL file with problem_id and solution")
    try:
        df = pl.read_ndjson(p) if p.suffix in (".jsonl", ".json") else pl.read_parquet(p)
    except Exception as exc:  # polars raises several kinds for a malformed file
        raise DataError(f"{p}: cannot read {what} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                        "give a Parquet or JSONL file with problem_id and solution") from exc
    missing = [c for c in ("problem_id", "solution") if c not in df.columns]
    if missing:
        raise DataError(f"{p}: {what} lacks column(s) {missing} (found: {', '.join(df.columns[:10])}); "
                        "it needs problem_id and solution")
    df = df.select(pl.col("problem_id").cast(pl.String), pl.col("solution").cast(pl.String)).drop_nulls()
    return dict(df.iter_rows())


def with_solutions(rows: list[dict], solutions: dict[str, str]) -> list[dict]:
    """`rows` (collapsed rows) with ``solution`` filled from `solutions` where the row has none."""
    return [r if r.get("solution") else {**r, "solution": solutions.get(r["problem_id"])} for r in rows]


def solution_text(row: dict, max_chars: int = 2000) -> str:
    """A row's reference solution as the agents read it: GSM8K's ``<<calc>>`` notes and ``#### N`` line
    removed (the answer is given beside it), cut to `max_chars`; "" when there is none."""
    sol = row.get("solution") or ""
    if not sol.strip():
        return ""
    if row.get("domain") == "code":
        text = sol.rstrip()
    else:
        text = "\n".join(ln.rstrip() for ln in _CALC.sub("", sol).splitlines() if ln.strip() and not ln.startswith("####"))
    return text if len(text) <= max_chars else text[:max_chars] + "\n[...]"


__all__ = ["load_solutions", "solution_text", "with_solutions"]
