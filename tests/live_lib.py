"""A live-hints round's rollout records as the tests read them (TRL and OpenRLHF write the same records)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from click.testing import CliRunner

from mentor.workflows.cli import cli


def by_status(records: list[dict]) -> dict[str, list[dict]]:
    """The records grouped by their ``live_status``."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["live_status"], []).append(r)
    return by


def check_rerolls(by: dict[str, list[dict]]) -> None:
    """Each re-roll is flagged, logged under its live hint's id, with the hint in its prompt and not in the problem."""
    assert all(r["live_rerolled"] for r in by["rerolled"]) and not any(r["live_rerolled"] for r in by["hinted"])
    for r in by["rerolled"]:
        assert r["hint_id"] == r["live_hint_id"] and r["live_hint"] in r["prompt"] and "Hint: " in r["prompt"]
        assert r["live_hint_status"] in ("accepted", "repaired", "fallback") and r["problem"] not in (None, "")
        assert r["live_hint"] not in r["problem"]


def ingest_and_mine(log_dir: Path, out: Path, *extra: str) -> pl.DataFrame:
    """`mentor ingest` (GSM8K problems; `extra` options) then `mentor mine` of the log, as of any round; the rollouts."""
    res = CliRunner().invoke(cli, ["ingest", str(log_dir), *extra, "--out", str(out / "ro"), "--problems", "gsm8k"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "ro" / "*.parquet")
    res = CliRunner().invoke(cli, ["mine", str(out / "ro"), "--out", str(out / "mined")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return df
