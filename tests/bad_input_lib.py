"""Shared machinery of the bad-input corpus tests (test_bad_input_*.py).

A case builds its inputs in a fresh folder, runs one `mentor` command in-process
(click's CliRunner) and states what a careful user must see: the exit code, the
first line of the message, the quarantine counters, and, for a failed command,
that the output folder is exactly as it was before (no partial output, no
temporary files left beside it). Every case is also classed as a clear error,
a counted quarantine or input that is handled correctly, for the report.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner, Result

from mentor.workflows.cli import cli

KINDS = ("error", "quarantine", "handled")


@dataclass
class Case:
    id: str
    kind: str  # error | quarantine | handled
    make: Callable[[Path], list[str]]  # builds the inputs under the folder; returns the argv after `mentor`
    exit: int
    message: str | None = None  # regex searched in the first line of the error (or of the output)
    quarantined: dict[str, int] = field(default_factory=dict)  # expected counters (a subset of stats.json's)
    stats: dict[str, object] = field(default_factory=dict)  # other expected stats.json values
    check: Callable[[Path, Result], None] | None = None  # further assertions
    out: str = "out"  # the output folder, relative to the case folder
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


def params(cases: list[Case]):
    import pytest

    return [pytest.param(c, id=c.id) for c in cases]


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def error_line(res: Result) -> str:
    """The first line of the error message (click's "Error: ..."), else the output's first line."""
    text = res.output
    for line in text.splitlines():
        if line.startswith("Error:"):
            return line
    return text.splitlines()[0] if text.strip() else ""


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file below `path` (hidden ones too) with its bytes; None when `path` does not exist."""
    if not path.exists():
        return None
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


_STAGED = re.compile(r"^\..+\.[a-z]+-\d+-[a-z0-9_]+(\.old)?\.tmp$")


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders of mentor's writers in `folder` and, recursively, below it."""
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if _STAGED.match(p.name) or
                  (p.name.startswith(".") and p.name.endswith(".tmp")))


def staged_beside(folder: Path) -> list[str]:
    """The staged folders (``.<name>.<command>-<pid>-<rand>[.old].tmp``) a run left in `folder`, not recursing."""
    return sorted(p.name for p in folder.iterdir() if _STAGED.match(p.name)) if folder.exists() else []


def run_case(case: Case, root: Path, prepare_out: Callable[[Path], None] | None = None) -> Result:
    """Build, run and check one case; returns click's result for extra assertions."""
    root.mkdir(parents=True, exist_ok=True)
    argv = case.make(root)
    out = root / case.out
    if prepare_out is not None and not out.exists():
        prepare_out(out)
    before = snapshot(out)
    started = time.monotonic()
    res = invoke(argv)
    took = time.monotonic() - started
    shown = f"{case.id}: exit {res.exit_code}\n{res.output[-3000:]}"
    # Never a traceback: either a clean exit or click's own SystemExit.
    assert res.exception is None or isinstance(res.exception, SystemExit), shown + f"\nexception: {res.exception!r}"
    assert "Traceback (most recent call last)" not in res.output, shown
    assert res.exit_code == case.exit, shown
    if case.message is not None:
        assert re.search(case.message, error_line(res)), f"{shown}\nfirst line: {error_line(res)!r}\nwanted: {case.message!r}"
    if res.exit_code != 0 and case.kind == "error":
        assert error_line(res).startswith("Error:"), shown
        # No partial output: the folder is exactly as it was, and nothing is left beside it.
        assert snapshot(out) == before, f"{shown}\nthe output folder changed"
    assert leftovers(root) == [], f"{shown}\nleft: {leftovers(root)}"
    if case.quarantined or case.stats:
        stats = json.loads((out / "stats.json").read_text())
        got = stats.get("quarantined", {})
        for reason, n in case.quarantined.items():
            assert got.get(reason, 0) == n, f"{shown}\nquarantined {got}, wanted {reason}={n}"
        for key, value in case.stats.items():
            assert stats.get(key) == value, f"{shown}\nstats[{key!r}] = {stats.get(key)!r}, wanted {value!r}"
    if case.max_seconds is not None:
        assert took < case.max_seconds, f"{case.id}: took {took:.2f}s"
    if case.check is not None:
        case.check(root, res)
    return res


def write_jsonl(path: Path, rows: list, raw_tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows) + raw_tail, encoding="utf-8")
    return path


def tally(*tables: list[Case]) -> dict[str, int]:
    out = {k: 0 for k in KINDS}
    for table in tables:
        for c in table:
            out[c.kind] += 1
    return out
