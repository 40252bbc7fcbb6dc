"""`mentor mine` on the real GSM8K rollouts: counts, failed samples, history, dask, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.schemas import COLLAPSED
from mentor.stages.mine import MineConfig, truncate_keep_end
from mine_lib import mine


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def split_shards(tmp_path_factory, bundled_rollouts) -> Path:
    """The real rollouts cut into 3 shards at row boundaries that split problems across shards."""
    d = tmp_path_factory.mktemp("shards")
    t = pq.read_table(bundled_rollouts)
    cuts = [0, 1757, 3514, t.num_rows]  # not multiples of 4: groups straddle shards
    for i in range(3):
        pq.write_table(t.slice(cuts[i], cuts[i + 1] - cuts[i]), d / f"part-{i:05d}.parquet")
    return d


def test_real_counts_and_outputs(bundled_rollouts, tmp_path):
    res = run("mine", str(bundled_rollouts), "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["rollouts"], stats["problems"], stats["collapsed"], stats["all_correct"], stats["mixed"]) == (5276, 1319, 432, 156, 731)
    assert stats["quarantined"] == {"problem_id_missing": 0, "round_invalid": 0, "sample_idx_invalid": 0,
                                    "correct_missing": 0, "correct_out_of_range": 0, "duplicate_key": 0}
    t = pq.read_table(tmp_path / "collapsed.parquet")
    assert t.schema.remove_metadata().equals(COLLAPSED)
    df = pl.from_arrow(t)
    assert df.height == 432
    assert df["n_rollouts"].unique().to_list() == [4]
    assert df["streak"].unique().to_list() == [1]
    assert df["previous_hints"].list.len().max() == 0
    # up to k_failed=2, deduplicated, from the problem's own failed responses
    assert df["failed"].list.len().max() == 2
    rollouts = pl.read_parquet(bundled_rollouts)
    row = df.row(0, named=True)
    own = rollouts.filter(pl.col("problem_id") == row["problem_id"])
    assert (own["correct"] == 0).all()
    assert set(row["failed"]) <= set(own["response"].to_list())
    assert len(set(row["failed"])) == len(row["failed"])
    assert row["label"] and row["problem"]


def test_collapsed_set_matches_bare_groupby(bundled_rollouts, tmp_path):
    df, _ = mine([str(bundled_rollouts)], MineConfig())
    bare = (
        pl.read_parquet(bundled_rollouts).group_by("problem_id").agg(pl.col("correct").max())
        .filter(pl.col("correct") == 0)["problem_id"].sort()
    )
    assert df["problem_id"].to_list() == bare.to_list()


def test_truncation_keeps_the_end():
    text = "I start by reading the problem. " + "step " * 1000 + "so the final answer is A: 4242"
    cut = truncate_keep_end(text, 200)
    assert len(cut) <= 210 and cut.endswith("A: 4242") and cut.startswith("I start")
    # counted in characters, not bytes: multi-byte text is cut at the same places
    wide = "é" * 50 + "ü" * 300 + " ответ: 42"
    cut = truncate_keep_end(wide, 100)
    assert cut == "é" * 20 + " [...] " + wide[-80:]
    assert truncate_keep_end("short", 100) == "short"


def test_budget_applied_in_mine(bundled_rollouts):
    df, _ = mine([str(bundled_rollouts)], MineConfig(failed_budget_chars=100, k_failed=4))
    lens = df["failed"].explode().str.len_chars()
    assert lens.max() <= 100 + len(" [...] ")
    assert df["failed"].list.len().max() <= 4


def test_rerun_identical_bytes(bundled_rollouts, tmp_path):
    for d in ("a", "b"):
        assert run("mine", str(bundled_rollouts), "--out", str(tmp_path / d)).exit_code == 0
    assert (tmp_path / "a/collapsed.parquet").read_bytes() == (tmp_path / "b/collapsed.parquet").read_bytes()
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]


def test_shard_split_gives_same_rows(bundled_rollouts, split_shards):
    whole, _ = mine([str(bundled_rollouts)], MineConfig())
    parts, stats = mine([str(split_shards)], MineConfig())
    assert stats.shards == 3
    assert whole.equals(parts)


def test_dask_localcluster_same_rows(bundled_rollouts, split_shards, tmp_path):
    res = run("mine", str(split_shards), "--out", str(tmp_path / "dask"), "--workers", "2")
    assert res.exit_code == 0, res.output
    res = run("mine", str(split_shards), "--out", str(tmp_path / "local"))
    assert res.exit_code == 0, res.output
    a = pl.read_parquet(tmp_path / "dask/collapsed.parquet")
    b = pl.read_parquet(tmp_path / "local/collapsed.parquet")
    assert a.height == 432 and a.equals(b)


def test_history_fills_streak_and_previous_hints(bundled_rollouts, tmp_path):
    """Round 1 mined with round 0's collapsed set and hints as history."""
    r0, _ = mine([str(bundled_rollouts)], MineConfig())
    (tmp_path / "r0").mkdir()
    from mentor.pipeline.io import write_parquet_atomic

    write_parquet_atomic(r0, tmp_path / "r0/collapsed.parquet", dataset="collapsed")
    ids = r0["problem_id"].to_list()
    hints = pl.DataFrame({"problem_id": ids[:10], "round": [0] * 10, "hint_id": ["h"] * 10, "hint": [f"hint {i}" for i in range(10)],
                          "status": ["accepted"] * 10})
    hints.write_parquet(tmp_path / "r0/hints.parquet")
    t = pq.read_table(bundled_rollouts)
    t = t.set_column(t.schema.get_field_index("round"), "round", pa.array([1] * t.num_rows, pa.int32()))
    pq.write_table(t, tmp_path / "r1.parquet")
    res = run("mine", str(tmp_path / "r1.parquet"), "--out", str(tmp_path / "r1"),
              "--history", str(tmp_path / "r0/collapsed.parquet"), "--history", str(tmp_path / "r0/hints.parquet"))
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "r1/collapsed.parquet")
    assert df["streak"].unique().to_list() == [2]
    assert df["round"].unique().to_list() == [1]
    got = df.filter(pl.col("problem_id") == ids[3])["previous_hints"].to_list()[0]
    assert got == ["hint 3"]
    assert df.filter(pl.col("previous_hints").list.len() > 0).height == 10


def test_threshold_and_min_rollouts(bundled_rollouts):
    _, s = mine([str(bundled_rollouts)], MineConfig(min_rollouts=5))
    assert s.collapsed == 0 and s.too_few_rollouts == 1319


def test_reward_is_never_the_correctness_column(bundled_rollouts, tmp_path):
    res = run("mine", str(bundled_rollouts), "--out", str(tmp_path), "--correct-col", "reward")
    assert res.exit_code == 2 and "shaped" in res.output


def test_mine_quarantines_bad_rows_in_canonical_data(bundled_rollouts, tmp_path):
    t = pl.read_parquet(bundled_rollouts)
    bad = t.head(4).with_columns(pl.Series("correct", [None, float("nan"), 2.0, 0.0]), pl.lit("zz").alias("problem_id"))
    dup = t.head(1)
    pl.concat([t, bad, dup]).write_parquet(tmp_path / "r.parquet")
    _, s = mine([str(tmp_path / "r.parquet")], MineConfig(min_rollouts=1))
    assert dict(s.quarantined) == {"correct_missing": 2, "correct_out_of_range": 1, "duplicate_key": 1}
    assert s.problems == 1320 and s.collapsed == 433  # zz: its one valid rollout is wrong


def test_mixed_schemas_error(bundled_rollouts, tmp_path):
    t = pq.read_table(bundled_rollouts)
    pq.write_table(t, tmp_path / "part-0.parquet")
    pq.write_table(t.drop(["step"]), tmp_path / "part-1.parquet")
    res = run("mine", str(tmp_path), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1
    assert "part-1.parquet: shards have mixed schemas" in res.output and "step" in res.output
    assert not (tmp_path / "o" / "collapsed.parquet").exists()


def test_missing_column_and_wrong_type(bundled_rollouts, tmp_path):
    t = pq.read_table(bundled_rollouts)
    pq.write_table(t.drop(["correct"]), tmp_path / "nocorrect.parquet")
    res = run("mine", str(tmp_path / "nocorrect.parquet"), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1 and "nocorrect.parquet" in res.output and "column 'correct' missing" in res.output
    t2 = t.set_column(t.schema.get_field_index("problem_id"), "problem_id", pa.array(range(t.num_rows)))
    pq.write_table(t2, tmp_path / "intid.parquet")
    res = run("mine", str(tmp_path / "intid.parquet"), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1 and "column 'problem_id' has type int64, expected string" in res.output


def test_missing_and_empty_inputs(tmp_path):
    res = run("mine", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "no such file" in res.output
    (tmp_path / "e.parquet").write_bytes(b"")
    res = run("mine", str(tmp_path / "e.parquet"), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1 and "e.parquet: the file is empty" in res.output


def _reference_counts(df: pl.DataFrame, min_rollouts: int = 2) -> tuple[set[str], int, int]:
    """Collapsed ids, distinct valid rollouts and duplicates, computed the plain way (exact distinct keys)."""
    c = pl.col("correct").cast(pl.Float64)
    valid = df.filter(c.is_not_null() & ~c.is_nan() & (c >= 0) & (c <= 1))
    per = valid.group_by("problem_id").agg(n=pl.struct("round", "sample_idx").n_unique(), max_c=c.max())
    ids = set(per.filter((pl.col("n") >= min_rollouts) & (pl.col("max_c") <= 0))["problem_id"])
    n_unique = int(per["n"].sum())
    return ids, n_unique, valid.height - n_unique


@pytest.fixture(scope="module")
def scattered(tmp_path_factory, bundled_rollouts) -> tuple[Path, pl.DataFrame]:
    """Real rollouts made awkward: several rounds, sample_idx >= 64, duplicates, rows shuffled over 4 shards."""
    d = tmp_path_factory.mktemp("scattered")
    t = pl.read_parquet(bundled_rollouts)
    ids = t["problem_id"].unique().sort()
    wide, rounds = ids[:40].to_list(), ids[40:80].to_list()
    t = t.with_columns(
        sample_idx=pl.when(pl.col("problem_id").is_in(wide)).then(pl.col("sample_idx") * 50).otherwise("sample_idx"),
        round=pl.when(pl.col("problem_id").is_in(rounds) & (pl.col("sample_idx") >= 2)).then(1).otherwise("round").cast(pl.Int32),
    )
    t = pl.concat([t, t.filter(pl.col("problem_id").is_in(ids[100:130].to_list()) & (pl.col("sample_idx") == 1))])
    t = t.sample(fraction=1.0, shuffle=True, seed=7)
    for i, part in enumerate(t.with_columns(_n=pl.int_range(pl.len()) % 4).partition_by("_n", include_key=False)):
        part.write_parquet(d / f"part-{i}.parquet")
    return d, t


def test_scattered_layout_matches_reference_and_one_file(scattered, tmp_path):
    d, t = scattered
    ids, n_unique, dups = _reference_counts(t)
    df, stats = mine([str(d)], MineConfig())
    assert set(df["problem_id"]) == ids and stats.collapsed == len(ids)
    assert stats.rollouts == n_unique and stats.quarantined["duplicate_key"] == dups == 30
    one = tmp_path / "one.parquet"
    t.sort("problem_id", "round", "sample_idx").write_parquet(one)
    whole, _ = mine([str(one)], MineConfig())
    assert whole.equals(df)  # the failed responses do not depend on how rows are split or ordered
    # the problems spread over rounds report their newest round
    assert df.filter(pl.col("round") == 1).height == len(ids & set(t.filter(pl.col("round") == 1)["problem_id"]))


def test_counting_in_parts_gives_the_same_counts(scattered, tmp_path):
    """Problems counted a part at a time (each id hashes to one part; a null or empty id too) add up to one count."""
    from mentor.stages.mine import count_part

    _, t = scattered
    t = t.with_columns(problem_id=pl.when(pl.int_range(pl.len()) % 97 == 0).then(None)
                       .when(pl.int_range(pl.len()) % 89 == 0).then(pl.lit("")).otherwise("problem_id"))
    files = []
    for i, part in enumerate(t.with_columns(_n=pl.int_range(pl.len()) % 3).partition_by("_n", include_key=False)):
        part.write_parquet(tmp_path / f"part-{i}.parquet")
        files.append(str(tmp_path / f"part-{i}.parquet"))
    whole = count_part(0, files, MineConfig())
    parts = [count_part(p, files, MineConfig(), parts=5) for p in range(5)]
    assert all(p["collapsed"].height for p in parts)  # the problems are spread over the parts
    for key in ("kinds", "rows"):
        assert {k: sum(p[key][k] for p in parts) for k in whole[key]} == whole[key]
    assert whole["rows"]["problem_id_missing"] > 0
    merged = pl.concat([p["collapsed"] for p in parts]).sort("problem_id")
    assert merged.equals(whole["collapsed"].sort("problem_id"))


def test_no_failed_kept_and_empty_responses(bundled_rollouts, tmp_path):
    t = pl.read_parquet(bundled_rollouts)
    df0, _ = mine([str(bundled_rollouts)], MineConfig(k_failed=0))
    assert df0.height == 432 and df0["failed"].list.len().max() == 0 and df0["problem"].str.len_chars().min() > 0
    pid = df0["problem_id"][0]
    t.with_columns(response=pl.when(pl.col("problem_id") == pid).then(pl.lit("  ")).otherwise("response")).write_parquet(
        tmp_path / "r.parquet"
    )
    df, _ = mine([str(tmp_path / "r.parquet")], MineConfig())
    row = df.filter(pl.col("problem_id") == pid).row(0, named=True)
    assert row["failed"] == [] and row["problem"] and row["label"]


def test_the_collapsed_set_carries_the_reference_solution(bundled_rollouts, tmp_path):
    """Every collapsed GSM8K problem gets GSM8K's worked solution (bundled, by id); --solutions takes another file."""
    from mentor.data import bundled

    df, _ = mine([str(bundled_rollouts)], MineConfig())
    sols = dict(pl.read_parquet(bundled("gsm8k_solutions.parquet")).iter_rows())
    assert df["solution"].null_count() == 0 and all(r["solution"] == sols[r["problem_id"]] for r in df.iter_rows(named=True))
    own = tmp_path / "s.jsonl"
    pid = df["problem_id"][0]
    own.write_text(json.dumps({"problem_id": pid, "solution": "Step one. Step two."}) + "\n")
    res = run("mine", str(bundled_rollouts), "--out", str(tmp_path / "m"), "--solutions", str(own))
    assert res.exit_code == 0, res.output
    got = pl.read_parquet(tmp_path / "m" / "collapsed.parquet")
    assert got.filter(pl.col("problem_id") == pid)["solution"][0] == "Step one. Step two." and got["solution"].null_count() == 431
    bad = run("mine", str(bundled_rollouts), "--out", str(tmp_path / "x"), "--solutions", str(tmp_path / "nope.parquet"))
    assert bad.exit_code == 2 and "nope.parquet: --solutions file not found" in bad.output
