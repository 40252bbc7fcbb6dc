"""`mentor mine` over a corpus of bad inputs built from the bundled real GSM8K rollouts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_input_lib import Case, invoke, params, run_case


def _rollouts() -> pl.DataFrame:
    from mentor.data import bundled

    return pl.read_parquet(bundled("gsm8k_rollouts.parquet"))


def _mine(root: Path, frame: pl.DataFrame | None = None, *extra: str, name: str = "r.parquet") -> list[str]:
    if frame is not None:
        frame.write_parquet(root / name)
    return ["mine", str(root / name), "--out", str(root / "out"), *extra]


def _first(n: int) -> pl.Expr:
    return pl.int_range(pl.len()) < n


def make_cases() -> list[Case]:
    t = _rollouts()
    base = {"rollouts": 5276, "problems": 1319, "collapsed": 432}
    cases: list[Case] = []
    add = cases.append

    # ---------------------------------------------------------------- quarantined by reason
    # Null ids are their own reason, never one merged problem (nor duplicate_key).
    nulls = t.with_columns(pl.when(_first(8)).then(None).otherwise(pl.col("problem_id")).alias("problem_id"))
    add(Case("pid-null", "quarantine", lambda r: _mine(r, nulls), 0,
             quarantined={"problem_id_missing": 8, "duplicate_key": 0}, stats={"rollouts": 5268, "problems": 1317}))
    empty = t.with_columns(pl.when(_first(4)).then(pl.lit("")).otherwise(pl.col("problem_id")).alias("problem_id"))
    add(Case("pid-empty", "quarantine", lambda r: _mine(r, empty), 0, quarantined={"problem_id_missing": 4},
             stats={"rollouts": 5272, "problems": 1318}))
    big_round = t.with_columns(pl.when(_first(1)).then(2**40).otherwise(pl.col("round").cast(pl.Int64)).alias("round"))
    add(Case("round-2^40", "quarantine", lambda r: _mine(r, big_round), 0, quarantined={"round_invalid": 1}, stats={"rollouts": 5275}))
    neg_round = t.with_columns(pl.when(_first(1)).then(-3).otherwise(pl.col("round")).alias("round"))
    add(Case("round-negative", "quarantine", lambda r: _mine(r, neg_round), 0, quarantined={"round_invalid": 1}))
    null_round = t.with_columns(pl.when(_first(2)).then(None).otherwise(pl.col("round")).alias("round"))
    add(Case("round-null", "quarantine", lambda r: _mine(r, null_round), 0, quarantined={"round_invalid": 2}))
    neg_idx = t.with_columns(pl.when(_first(1)).then(-1).otherwise(pl.col("sample_idx")).alias("sample_idx"))
    add(Case("sample-idx-negative", "quarantine", lambda r: _mine(r, neg_idx), 0, quarantined={"sample_idx_invalid": 1}))
    big_idx = t.with_columns(pl.when(_first(1)).then(2**35).otherwise(pl.col("sample_idx").cast(pl.Int64)).alias("sample_idx"))
    add(Case("sample-idx-2^35", "quarantine", lambda r: _mine(r, big_idx), 0, quarantined={"sample_idx_invalid": 1}))
    null_idx = t.with_columns(pl.when(_first(1)).then(None).otherwise(pl.col("sample_idx")).alias("sample_idx"))
    add(Case("sample-idx-null", "quarantine", lambda r: _mine(r, null_idx), 0, quarantined={"sample_idx_invalid": 1}))
    correct = t.with_columns(pl.when(_first(3)).then(pl.Series([None, float("nan"), 2.0] + [0.0] * (t.height - 3)))
                             .otherwise(pl.col("correct")).alias("correct"))
    add(Case("correct-null-nan-2", "quarantine", lambda r: _mine(r, correct), 0,
             quarantined={"correct_missing": 2, "correct_out_of_range": 1}))
    dup = pl.concat([t, t.head(5)])
    add(Case("duplicates", "quarantine", lambda r: _mine(r, dup), 0, quarantined={"duplicate_key": 5}, stats=base))
    add(Case("clean", "handled", lambda r: _mine(r, t), 0, stats=base))

    # A shard whose columns are int64/large strings (another writer) is read as it is.
    wide = t.with_columns(pl.col("round").cast(pl.Int64), pl.col("sample_idx").cast(pl.Int64))
    add(Case("int64-keys", "handled", lambda r: _mine(r, wide), 0, stats=base))

    # --correct-col on other columns
    bools = t.with_columns(ok=pl.col("correct") > 0.5)
    add(Case("correct-col-bool", "handled", lambda r: _mine(r, bools, "--correct-col", "ok"), 0, stats=base))
    add(Case("correct-col-string", "error", lambda r: _mine(r, t.with_columns(verdict=pl.lit("yes")), "--correct-col", "verdict"),
             1, r"r\.parquet: column 'verdict' \(--correct-col\) has type string; correctness must be a number"))
    add(Case("correct-col-missing", "error", lambda r: _mine(r, t, "--correct-col", "acc"), 2, r"column 'acc' \(--correct-col\) missing"))
    add(Case("correct-col-reward", "error", lambda r: _mine(r, t, "--correct-col", "reward"), 2, r"shaped"))

    # Every collapsed problem must have a problem text: none at all is a clear error (COLLAPSED.problem is required).
    no_text = t.with_columns(pl.lit(None, pl.String).alias("problem"), pl.lit(None, pl.String).alias("prompt"))
    add(Case("no-problem-text", "error", lambda r: _mine(r, no_text), 1, r"r\.parquet: collapsed problem\(s\) .* have no problem text"))
    no_domain = t.with_columns(pl.lit(None, pl.String).alias("domain"))
    add(Case("no-domain", "error", lambda r: _mine(r, no_domain), 1, r"have no domain"))

    # ---------------------------------------------------------------- clear errors
    add(Case("missing-input", "error", lambda r: ["mine", str(r / "nope"), "--out", str(r / "out")], 2, r"nope: no such file"))

    def empty_file(r: Path) -> list[str]:
        (r / "e.parquet").write_bytes(b"")
        return _mine(r, None, name="e.parquet")

    add(Case("empty-file", "error", empty_file, 1, r"e\.parquet: the file is empty"))

    def corrupt(r: Path) -> list[str]:
        from mentor.data import bundled

        (r / "c.parquet").write_bytes(bundled("gsm8k_rollouts.parquet").read_bytes()[:4000])
        return _mine(r, None, name="c.parquet")

    add(Case("corrupt-parquet", "error", corrupt, 1, r"c\.parquet: not a readable Parquet file"))

    def jsonl_given(r: Path) -> list[str]:
        (r / "r.jsonl").write_text('{"a": 1}\n')
        return ["mine", str(r / "r.jsonl"), "--out", str(r / "out")]

    add(Case("jsonl-given", "error", jsonl_given, 1, r"r\.jsonl: not a readable Parquet file"))

    def mixed(r: Path) -> list[str]:
        (r / "in").mkdir()
        t.write_parquet(r / "in" / "part-0.parquet")
        t.drop("step").write_parquet(r / "in" / "part-1.parquet")
        return ["mine", str(r / "in"), "--out", str(r / "out")]

    add(Case("mixed-schemas", "error", mixed, 1, r"part-1\.parquet: shards have mixed schemas"))
    add(Case("missing-correct", "error", lambda r: _mine(r, t.drop("correct")), 1, r"column 'correct' missing"))

    def int_ids(r: Path) -> list[str]:
        a = t.to_arrow()
        a = a.set_column(a.schema.get_field_index("problem_id"), "problem_id", pa.array(range(a.num_rows)))
        pq.write_table(a, r / "r.parquet")
        return _mine(r, None)

    add(Case("int-problem-id", "error", int_ids, 1, r"column 'problem_id' has type int64, expected string"))
    for opt, v in [("--threshold", "1.5"), ("--threshold", "-0.1"), ("--threshold", "nan"), ("--threshold", "1"),
                   ("--min-rollouts", "0"), ("--k-failed", "-1"), ("--failed-budget", "10"), ("--workers", "0"),
                   ("--k-failed", str(2**70)), ("--min-rollouts", str(2**40)), ("--failed-budget", "1e3")]:
        add(Case(f"option{opt}={v}", "error", lambda r, o=opt, v=v: _mine(r, t, o, v), 2, opt))

    def bad_history(r: Path) -> list[str]:
        t.write_parquet(r / "h.parquet")
        return _mine(r, t, "--history", str(r / "h.parquet"))

    add(Case("history-not-collapsed", "error", bad_history, 1, r"h\.parquet: --history takes earlier collapsed"))

    def out_file(r: Path) -> list[str]:
        (r / "o").write_text("x")
        return ["mine", *(_mine(r, t)[1:2]), "--out", str(r / "o")]

    add(Case("out-is-a-file", "error", out_file, 2, r"--out"))

    def stale_temps(r: Path) -> list[str]:
        shutil.copytree(OLD["mine"], r / "out")
        for i in range(7):
            (r / "out" / f".collapsed.parquet.k{i}x.tmp").write_bytes(b"half")
        (r / ".out.mine-999999999-abc123.tmp").mkdir()
        return _mine(r, t)

    add(Case("stale-temp-files-cleaned", "handled", stale_temps, 0, stats=base))

    def loop(r: Path) -> list[str]:
        (r / "in" / "a").mkdir(parents=True)
        t.write_parquet(r / "in" / "a" / "part-0.parquet")
        os.symlink("..", r / "in" / "a" / "loop")
        return ["mine", str(r / "in" / "**" / "*.parquet"), "--out", str(r / "out")]

    add(Case("symlink-loop-glob", "handled", loop, 0, stats=base, max_seconds=30))
    return cases


OLD: dict[str, Path] = {}
CASES = make_cases()


@pytest.fixture(scope="module")
def old_output(tmp_path_factory) -> Path:
    from mentor.data import bundled

    d = tmp_path_factory.mktemp("old")
    res = invoke(["mine", str(bundled("gsm8k_rollouts.parquet")), "--out", str(d / "out"), "--k-failed", "1"])
    assert res.exit_code == 0, res.output
    OLD["mine"] = d / "out"
    return d / "out"


@pytest.mark.parametrize("case", params(CASES))
def test_mine_bad_input(case: Case, tmp_path, old_output):
    run_case(case, tmp_path / "case", prepare_out=lambda out: shutil.copytree(old_output, out))


def test_null_ids_do_not_merge_into_one_collapsed_problem(tmp_path):
    """Two problems whose ids were lost must not become one problem "None" (nor a collapse of their union)."""
    t = _rollouts()
    ids = t["problem_id"].unique().sort().head(2).to_list()
    lost = t.with_columns(pl.when(pl.col("problem_id").is_in(ids)).then(None).otherwise(pl.col("problem_id")).alias("problem_id"))
    lost.write_parquet(tmp_path / "r.parquet")
    res = invoke(["mine", str(tmp_path / "r.parquet"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "o" / "collapsed.parquet")
    assert df["problem_id"].null_count() == 0 and "None" not in df["problem_id"].to_list()
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["problems"] == 1317 and stats["quarantined"]["problem_id_missing"] == 8
