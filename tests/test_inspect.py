"""`mentor inspect`: summaries of real GSM8K data and of a small run directory built here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import write_json_atomic, write_parquet_atomic
from mentor.pipeline.schemas import conform
from mentor.stages.build import BUILD, BuildConfig
from mentor.stages.mine import MINE, MineConfig
from mentor.workflows.report import detect, inspect_path, problem_history
from mentor.workflows.report_render import render_table, to_json

N_HINTED = 10
N_RESCUED = 6


def hints_table(ids: list[str], round_: int, prefix: str = "") -> pa.Table:
    statuses = ["accepted", "accepted", "repaired", "fallback"]
    rows = [
        {
            "problem_id": pid,
            "round": round_,
            "hint_id": f"h{round_}-{i:03d}",
            "hint": f"{prefix}Write down what is known before combining the amounts in step {i}.",
            "keywords": ["Unit rate", "subtraction"] if i % 2 else ["unit rate", "remainder"],
            "error": "adds instead of subtracting",
            "status": statuses[i % 4],
            "retries": i % 3,
            "refines": 1 if statuses[i % 4] == "repaired" else 0,
            "judge_score": 0.5 + i / 100,
            "violations": ["answer_leak"] if i % 4 == 3 else (["too_long", "answer_leak"] if i % 4 == 2 else []),
            "trace": [],
            "model": "fake",
            "prompt_version": "v-test",
            "config_hash": "c-test",
        }
        for i, pid in enumerate(ids)
    ]
    return conform(pa.Table.from_pylist(rows), "hints")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, bundled_rollouts) -> dict:
    """runs/demo with two rounds (the run-directory layout of `mentor.pipeline.rundir`):

    round-000: the real GSM8K rollouts, their collapsed set (432), hints for 10
               collapsed problems, the prompts built from them;
    round-001: the same rollouts as round 1, except that 6 of the 10 hinted
               problems now have one correct (hinted) rollout and 4 stay collapsed;
               its collapsed set (426), escalated hints for the 4, and a rescue check.
    """
    root = tmp_path_factory.mktemp("runs") / "demo"
    r0, r1 = root / "round-000", root / "round-001"
    (r0 / "rollouts").mkdir(parents=True)
    shutil.copy(bundled_rollouts, r0 / "rollouts" / "part-00000.parquet")
    MINE({"sources": [str(r0 / "rollouts")]}, MineConfig(), r0 / "collapsed")
    collapsed = pl.read_parquet(r0 / "collapsed" / "collapsed.parquet").get_column("problem_id").sort().to_list()
    hinted = collapsed[:N_HINTED]
    write_parquet_atomic(hints_table(hinted, 0), r0 / "hints" / "hints.parquet", dataset="hints")
    BUILD({}, BuildConfig(base="gsm8k", hints=[str(r0 / "hints" / "hints.parquet")]), r0 / "prompts")

    roll = pl.read_parquet(bundled_rollouts).with_columns(pl.lit(1, pl.Int32).alias("round"))
    rescued = hinted[:N_RESCUED]
    hint_of = {pid: f"h0-{i:03d}" for i, pid in enumerate(hinted)}
    roll = roll.with_columns(
        pl.when(pl.col("problem_id").is_in(rescued) & (pl.col("sample_idx") == 0)).then(1.0).otherwise(pl.col("correct")).alias("correct"),
        pl.col("problem_id").replace_strict(hint_of, default=None, return_dtype=pl.String).alias("hint_id"),
    )
    write_parquet_atomic(roll, r1 / "rollouts" / "part-00000.parquet", dataset="rollouts")
    MINE({"sources": [str(r1 / "rollouts")], "history": [str(r0 / "collapsed" / "collapsed.parquet"), str(r0 / "hints" / "hints.parquet")]},
         MineConfig(), r1 / "collapsed")
    still = hinted[N_RESCUED:]
    write_parquet_atomic(hints_table(still, 1, prefix="Stronger: "), r1 / "hints" / "hints.parquet", dataset="hints")
    # The rescue check, in the layout `mentor rescue` writes (rescue.parquet + stats.json).
    rescue = pl.DataFrame(
        {
            "problem_id": still,
            "rescued_hinted": [True, True, False, False],
            "rescued_unhinted": [False, False, False, True],
            "correct_hinted": [2, 1, 0, 0],
            "correct_unhinted": [0, 0, 0, 1],
        }
    )
    write_parquet_atomic(rescue, r1 / "rescue" / "rescue.parquet")
    write_json_atomic({"problems": 4, "rescued_hinted": 2, "rescued_unhinted": 1, "rescue_rate_hinted": 0.5,
                       "rescue_rate_unhinted": 0.25, "lift": 0.25}, r1 / "rescue" / "stats.json")
    return {"root": root, "hinted": hinted, "rescued": rescued, "still": still}


# --------------------------------------------------------------------------- single datasets


def test_real_gsm8k_rollouts(bundled_rollouts):
    s = inspect_path(bundled_rollouts)
    assert s["kind"] == "rollouts" and s["problems"] == 1319 and s["rollouts"] == 5276
    assert s["collapsed"] == 432 and s["collapse_rate"] == round(432 / 1319, 6)
    assert s["all_correct"] == 156 and s["all_correct_rate"] == round(156 / 1319, 6)
    assert s["rollouts_per_problem"] == {"min": 4, "mean": 4.0, "max": 4}
    assert len(s["by_round"]) == 1 and s["by_round"][0]["round"] == 0 and s["by_round"][0]["collapsed"] == 432
    mean = pl.read_parquet(bundled_rollouts)["correct"].mean()
    assert abs(s["mean_correct"] - mean) < 1e-4
    r = CliRunner().invoke(cli, ["inspect", str(bundled_rollouts), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["collapse_rate"] == pytest.approx(432 / 1319, abs=1e-6)
    r = CliRunner().invoke(cli, ["inspect", str(bundled_rollouts)])
    assert r.exit_code == 0 and "collapse_rate" in r.output and "0.327521" in r.output and "by_round:" in r.output


def test_real_collapsed_and_problems(gsm8k_collapsed):
    s = inspect_path(gsm8k_collapsed)
    assert s["kind"] == "collapsed" and s["problems"] == 432 and s["streak"] == {"1": 432}
    assert s["n_rollouts"]["min"] == s["n_rollouts"]["max"] == 4 and s["failed_kept"]["max"] <= 2
    from mentor.data import bundled

    p = inspect_path(bundled("math500_problems.parquet"))
    assert p["kind"] == "problems" and p["problems"] == 500 and p["distinct_ids"] == 500


def test_hints_summary(run_dir):
    s = inspect_path(run_dir["root"] / "round-000" / "hints")
    assert s["kind"] == "hints" and s["hints"] == N_HINTED
    assert s["status"] == {"accepted": 6, "repaired": 2, "fallback": 2}
    assert s["violations"] == {"answer_leak": 4, "too_long": 2}
    assert s["retries"]["total"] == sum(i % 3 for i in range(N_HINTED)) and s["refines"]["total"] == 2
    assert s["top_keywords"][0] == {"keyword": "unit rate", "count": N_HINTED}  # case-folded
    assert s["hint_chars"]["n"] == N_HINTED and s["hint_chars"]["min"] > 20
    assert len(s["samples"]) == 3 and [x["status"] for x in s["samples"]] == ["accepted", "repaired", "fallback"]
    text = render_table(s)
    assert "answer_leak" in text and "unit rate" in text and "samples:" in text


def test_prompts_summary_and_manifest_check(run_dir, tmp_path):
    prompts = run_dir["root"] / "round-000" / "prompts"
    s = inspect_path(prompts)
    assert s["kind"] == "prompts" and s["rows"] == 1319 and s["hinted_rows"] == N_HINTED
    assert s["hinted_share"] == round(N_HINTED / 1319, 6) and s["rounds"] == [1]
    assert s["shards"][0]["file"] == "part-00000.parquet" and s["shards"][0]["bytes"] > 0
    assert s["manifest"]["verified"] is True
    tampered = tmp_path / "p"
    shutil.copytree(prompts, tampered)
    shard = tampered / "part-00000.parquet"
    pq.write_table(pq.read_table(shard).slice(0, 10), shard)
    t = inspect_path(tampered)
    assert t["manifest"]["verified"] is False and t["manifest"]["mismatched"] == ["part-00000.parquet"]


def test_rescue_outputs(run_dir):
    s = inspect_path(run_dir["root"] / "round-001" / "rescue")
    assert s["kind"] == "rescue" and s["rescue_rate_hinted"] == 0.5 and s["rescue_rate_unhinted"] == 0.25
    assert s["rows"] == 4 and s["consistent"] is True
    assert detect(run_dir["root"] / "round-001" / "rescue" / "rescue.parquet") == "rescue"


# --------------------------------------------------------------------------- run directory


def test_run_directory_one_row_per_round(run_dir):
    s = inspect_path(run_dir["root"])
    assert s["kind"] == "run"
    r0, r1 = s["rounds"]
    assert r0["round"] == 0 and r1["round"] == 1
    assert r0["problems"] == 1319 and r0["collapsed"] == 432 and r0["collapse_rate"] == round(432 / 1319, 6)
    assert r1["collapsed"] == 432 - N_RESCUED and r1["collapse_rate"] == round((432 - N_RESCUED) / 1319, 6)
    assert (r0["accepted"], r0["repaired"], r0["fallback"]) == (6, 2, 2) and r0["hints"] == N_HINTED
    assert r0["prompts"] == 1319 and r0["hinted_share"] == round(N_HINTED / 1319, 6)
    assert r0["rescued_next"] == N_RESCUED and r0["rescued_next_rate"] == N_RESCUED / N_HINTED
    assert r1["rescued_next"] is None  # no round 2 yet
    assert r0["rescue_rate_hinted"] is None and r1["rescue_rate_hinted"] == 0.5  # rescue check absent / present
    assert r1["prompts"] is None and r1["hints"] == N_HINTED - N_RESCUED
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"]), "--format", "json"])
    assert r.exit_code == 0, r.output
    parsed = json.loads(r.output)
    assert parsed["rounds"][0]["collapsed"] == 432 and "details" in parsed
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"])])
    assert r.exit_code == 0 and "rounds:" in r.output and "rescued_next" in r.output and "collapse" in r.output
    assert "| 0 " in r.output and "| 1 " in r.output


def test_plot_png(run_dir, tmp_path, bundled_rollouts):
    out = tmp_path / "run.png"
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"]), "--plot", str(out)])
    assert r.exit_code == 0, r.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    out2 = tmp_path / "rollouts.png"
    r = CliRunner().invoke(cli, ["inspect", str(bundled_rollouts), "--plot", str(out2)])
    assert r.exit_code == 0 and out2.stat().st_size > 0
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"] / "round-000" / "hints"), "--plot", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "--plot needs" in r.output


def test_problem_history_rescued_and_not(run_dir):
    pid = run_dir["rescued"][0]
    h = problem_history(run_dir["root"], pid)
    e0, e1 = h["history"]
    assert e0["collapsed"] is True and e0["rollouts"]["correct"] == [0.0, 0.0, 0.0, 0.0]
    assert e0["hint"]["hint_id"] == "h0-000" and e0["hint"]["keywords"] == ["unit rate", "remainder"]
    assert e0["prompts"] == {"rows": 1, "hint_ids": ["h0-000"]}
    assert e0["rescued"] is True
    assert e1["collapsed"] is False and e1["rollouts"]["any_correct"] is True and e1["rollouts"]["hint_ids"] == ["h0-000"]
    pid = run_dir["still"][0]
    h = problem_history(run_dir["root"], pid)
    e0, e1 = h["history"]
    assert e0["rescued"] is False and e1["collapsed"] is True and e1["streak"] == 2
    assert e1["previous_hints"] and e1["hint"]["hint"].startswith("Stronger: ")
    assert e1["rescue_check"]["rescued_hinted"] is True and e1["rescue_check"]["rescued_unhinted"] is False
    assert e1["rescued"] is None
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"]), "--problem", pid, "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.output)["problem_id"] == pid
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"]), "--problem", pid])
    assert r.exit_code == 0 and "round 1:" in r.output and "Stronger" in r.output and "rescued" in r.output
    r = CliRunner().invoke(cli, ["inspect", str(run_dir["root"]), "--problem", "p-nope"])
    assert r.exit_code == 1 and "p-nope" in r.output


def test_problem_in_one_dataset(bundled_rollouts):
    pid = pl.read_parquet(bundled_rollouts)["problem_id"][0]
    h = problem_history(bundled_rollouts, pid)
    assert h["kind"] == "rollouts" and h["history"][0]["round"] == 0 and len(h["history"][0]["correct"]) == 4
    with pytest.raises(DataError, match="not found"):
        problem_history(bundled_rollouts, "p-nope")


def test_errors(tmp_path):
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such file" in r.output
    pl.DataFrame({"foo": [1], "bar": ["x"]}).write_parquet(tmp_path / "odd.parquet")
    with pytest.raises(DataError, match="cannot tell") as err:
        inspect_path(tmp_path / "odd.parquet")
    assert "bar, foo" in str(err.value)
    with pytest.raises(ConfigError):
        inspect_path(tmp_path / "empty_dir_does_not_exist")
    assert json.loads(to_json({"x": float("nan"), "y": [1.5]})) == {"x": None, "y": [1.5]}
