"""`mentor ingest`: every format on real GSM8K rollouts, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.ids import text_id
from mentor.stages.ingest_formats import GSM8K_MODELS
from mentor.stages.mine import MineConfig
from mine_lib import mine


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def read_rollouts(d: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted(d.glob("part-*.parquet")))


def gsm8k_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- real data, each format


def test_gsm8k_example_real_counts(gsm8k_example, tmp_path):
    res = run("ingest", str(gsm8k_example), "--format", "gsm8k-example", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    df = read_rollouts(tmp_path / "r")
    assert df.height == 5276
    assert df["problem_id"].n_unique() == 1319
    assert sorted(df["sample_idx"].unique().to_list()) == [0, 1, 2, 3]
    first = gsm8k_records(gsm8k_example)[0]
    row = df.filter(pl.col("problem_id") == text_id(first["question"])).sort("sample_idx")
    assert row["label"][0] == "18"
    assert row["correct"].to_list() == [float(first[m]["is_correct"]) for m in GSM8K_MODELS]
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    assert stats["rollouts"] == 5276 and stats["problems"] == 1319


def test_auto_sniffs_and_says_which(gsm8k_example, tmp_path):
    res = CliRunner().invoke(cli, ["ingest", str(gsm8k_example), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0
    assert "format: gsm8k-example (auto-detected)" in res.output


def test_rerun_gives_identical_bytes(gsm8k_example, tmp_path):
    for name in ("a", "b"):
        assert run("ingest", str(gsm8k_example), "--out", str(tmp_path / name)).exit_code == 0
    a = (tmp_path / "a" / "part-00000.parquet").read_bytes()
    b = (tmp_path / "b" / "part-00000.parquet").read_bytes()
    assert a == b
    assert not list((tmp_path / "a").glob(".*tmp"))


def _as_verl(records: list[dict], with_acc: bool) -> list[dict]:
    rows = []
    for rec in records:
        for m in GSM8K_MODELS:
            ok = float(rec[m]["is_correct"])
            row = {"input": rec["question"], "output": rec[m]["solution"], "step": 7,
                   "score": (ok * 2 - 1) if with_acc else ok,  # a shaped score when acc is present
                   "gts": rec["ground_truth"].rsplit("A:", 1)[-1].strip()}
            if with_acc:
                row["acc"] = ok
            rows.append(row)
    return rows


@pytest.mark.parametrize("with_acc", [True, False])
def test_verl_dump_real_data(gsm8k_example, tmp_path, with_acc):
    """A verl rollout_data_dir dump of the real rollouts: grouped by prompt hash, acc preferred over score."""
    records = gsm8k_records(gsm8k_example)
    rows = _as_verl(records, with_acc)
    dump = tmp_path / "dump"
    dump.mkdir()
    write_jsonl(dump / "7.jsonl", rows[: len(rows) // 2])
    write_jsonl(dump / "8.jsonl", rows[len(rows) // 2 :])
    res = run("ingest", str(dump), "--format", "auto", "--out", str(tmp_path / "r"), "--round", "3")
    assert res.exit_code == 0, res.output
    df = read_rollouts(tmp_path / "r")
    assert df.height == 5276 and df["problem_id"].n_unique() == 1319
    assert df["round"].unique().to_list() == [3]
    collapsed, stats = mine([str(tmp_path / "r")], MineConfig())
    assert stats.collapsed == 432 and stats.all_correct == 156


def test_jsonl_with_column_map(gsm8k_example, tmp_path):
    rows = []
    for i, rec in enumerate(gsm8k_records(gsm8k_example)):
        for j, m in enumerate(GSM8K_MODELS):
            rows.append({"qid": f"q{i}", "question": rec["question"], "completion": rec[m]["solution"],
                         "is_right": rec[m]["is_correct"], "ans": "x"})
    src = write_jsonl(tmp_path / "log.jsonl", rows)
    res = run("ingest", str(src), "--format", "jsonl", "--out", str(tmp_path / "r"),
              "--map", "problem_id=qid", "--map", "problem=question", "--map", "response=completion",
              "--map", "correct=is_right", "--map", "label=ans")
    assert res.exit_code == 0, res.output
    df = read_rollouts(tmp_path / "r")
    assert df.height == 5276 and df["problem_id"].n_unique() == 1319
    _, stats = mine([str(tmp_path / "r")], MineConfig())
    assert stats.collapsed == 432


def test_openrlhf_records_with_torn_last_line(tmp_path):
    """Our reward files' records; a killed writer's torn last line is quarantined, not fatal."""
    recs = []
    for pid in ("a", "b"):
        for seq in range(4):
            recs.append({"v": 1, "problem_id": pid, "round": 2, "domain": "math", "prompt": f"P {pid}",
                         "response": f"r{seq}", "correct": 0.0 if pid == "a" else float(seq == 1),
                         "reward": 0.0, "pid": 11, "seq": seq, "hint_id": None, "label": "5"})
    d = tmp_path / "logs"
    d.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in recs) + '{"v": 1, "problem_id": "a", "rou'
    (d / "rollouts-host-11.jsonl").write_text(text)
    res = run("ingest", str(d), "--format", "openrlhf", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "r" / "stats.json").read_text())
    assert stats["rollouts"] == 8 and stats["quarantined"] == {"bad_json_line": 1}
    df = read_rollouts(tmp_path / "r")
    assert df.filter(pl.col("problem_id") == "a")["sample_idx"].sort().to_list() == [0, 1, 2, 3]
    assert df["round"].unique().to_list() == [2]


def test_canonical_roundtrip_and_problem_fill(bundled_rollouts, tmp_path):
    res = run("ingest", str(bundled_rollouts), "--format", "canonical", "--out", str(tmp_path / "r"), "--round", "5")
    assert res.exit_code == 0, res.output
    df = read_rollouts(tmp_path / "r")
    assert df.height == 5276 and df["round"].unique().to_list() == [5]


# --------------------------------------------------------------------------- bad input


def test_missing_file_is_usage_error(tmp_path):
    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "nope.jsonl: no such file" in res.output


def test_empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "empty.jsonl"), "--format", "verl", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "empty.jsonl: the file is empty" in res.output
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


def test_corrupt_parquet(bundled_rollouts, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bundled_rollouts.read_bytes()[:5000])
    res = CliRunner().invoke(cli, ["ingest", str(bad), "--format", "canonical", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "bad.parquet: not a readable Parquet file" in res.output


def test_missing_required_column_names_column_and_fix(tmp_path):
    src = write_jsonl(tmp_path / "log.jsonl", [{"problem_id": "a", "response": "x", "is_right": 1}])
    res = CliRunner().invoke(cli, ["ingest", str(src), "--format", "jsonl", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "log.jsonl: column 'correct' missing" in res.output and "--map correct=" in res.output


def test_wrong_type_in_parquet(bundled_rollouts, tmp_path):
    t = pq.read_table(bundled_rollouts)
    t = t.set_column(t.schema.get_field_index("correct"), "correct", pa.array(["yes"] * t.num_rows))
    pq.write_table(t, tmp_path / "typed.parquet")
    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "typed.parquet"), "--format", "canonical", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "column 'correct' has type string, expected double" in res.output


def test_bad_rows_are_quarantined_and_counted(tmp_path):
    big = "x" * (10 * 1024 * 1024) + " A: 42"
    rows = [
        {"problem_id": "a", "sample_idx": 0, "prompt": "p", "response": "ok", "correct": 1},
        {"problem_id": "a", "sample_idx": 1, "prompt": "p", "response": "ok", "correct": None},
        {"problem_id": "a", "sample_idx": 2, "prompt": "p", "response": "ok", "correct": "NaN"},
        {"problem_id": "a", "sample_idx": 3, "prompt": "p", "response": "ok", "correct": 1.5},
        {"problem_id": "a", "sample_idx": 0, "prompt": "p", "response": "dup", "correct": 0},
        {"problem_id": "b", "sample_idx": 0, "prompt": "q", "response": big, "correct": 0},
        {"problem_id": "b", "sample_idx": 1, "prompt": "q", "response": "no", "correct": 0},
    ]
    src = write_jsonl(tmp_path / "log.jsonl", rows)
    res = run("ingest", str(src), "--format", "jsonl", "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.output
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["quarantined"] == {"correct_missing": 2, "correct_out_of_range": 1, "duplicate_key": 1}
    assert stats["response_clipped"] == 1 and stats["rollouts"] == 3
    df = read_rollouts(tmp_path / "o")
    clipped = df.filter(pl.col("problem_id") == "b", pl.col("sample_idx") == 0)["response"][0]
    assert len(clipped.encode()) < 1.1 * (1 << 20) and clipped.endswith("A: 42")
    assert df.filter(pl.col("problem_id") == "a")["response"].to_list() == ["ok"]


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    src = tmp_path / "latin.jsonl"
    src.write_bytes(b'{"input": "a", "output": "b", "score": 1}\n{"input": "caf\xe9", "output": "b", "score": 1}\n')
    res = CliRunner().invoke(cli, ["ingest", str(src), "--format", "verl", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "latin.jsonl:2: not UTF-8" in res.output and "re-encode" in res.output


def test_unknown_layout_asks_for_a_mapping(tmp_path):
    src = write_jsonl(tmp_path / "log.jsonl", [{"foo": 1}])
    res = CliRunner().invoke(cli, ["ingest", str(src), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "--format jsonl with --map" in res.output


def test_stale_shards_are_removed(gsm8k_example, bundled_rollouts, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    pq.write_table(pq.read_table(bundled_rollouts), out / "part-00007.parquet")
    assert run("ingest", str(gsm8k_example), "--out", str(out)).exit_code == 0
    assert [p.name for p in out.glob("part-*.parquet")] == ["part-00000.parquet"]
