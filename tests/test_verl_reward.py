"""verl's `compute_score` on prompt rows as `mentor build` lays them out; every rollout logged."""

from __future__ import annotations

import json

import polars as pl
from click.testing import CliRunner

from mentor.data import bundled
from mentor.workflows.cli import cli
from mentor.training.verl.reward import compute_score


def _row(domain_file: str, i: int) -> dict:
    r = pl.read_parquet(bundled(domain_file)).row(i, named=True)
    return {
        "data_source": r["data_source"],
        "ability": r["domain"],
        "reward_model": {"style": "rule", "ground_truth": r["label"]},
        "extra_info": {"problem_id": r["problem_id"], "hint_id": "h-1", "round": 2, "index": i},
        "problem": r["problem"],
    }


def test_compute_score_math_and_code_with_logging(tmp_path, monkeypatch):
    monkeypatch.setenv("MENTOR_ROLLOUT_DIR", str(tmp_path / "log"))
    math = _row("math500_problems.parquet", 2)  # \frac{14}{3}
    code = _row("humaneval_problems.parquet", 0)
    # verl's reward managers call with keyword arguments.
    call = lambda row, text: compute_score(  # noqa: E731
        data_source=row["data_source"], solution_str=text,
        ground_truth=row["reward_model"]["ground_truth"], extra_info=row["extra_info"],
    )
    assert call(math, r"... so $x=\boxed{\frac{14}{3}}$") == 1.0
    assert call(math, r"\boxed{4.67}") == 0.0
    good = "```python\n" + code["problem"] + "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n```"
    assert call(code, good) == 1.0
    assert call(code, "```python\ndef has_close_elements(n, t):\n    return False\n```") == 0.0
    # Never raises, whatever it is given.
    assert compute_score("x", None, None) == 0.0
    assert compute_score("x", "42", "42", extra_info="not a dict") == 1.0

    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "log"), "--format", "openrlhf", "--out", str(tmp_path / "ro")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "ro" / "*.parquet")
    assert df.height == 6
    assert df["source"].str.starts_with("verl:").all()
    logged = df.filter(pl.col("problem_id") == math["extra_info"]["problem_id"])
    assert logged.height == 2 and set(logged["hint_id"]) == {"h-1"} and set(logged["round"]) == {2}
    assert sorted(logged["correct"].to_list()) == [0.0, 1.0]
    code_rows = df.filter(pl.col("domain") == "code")
    assert code_rows.height == 2 and json.loads(code_rows["label"][0])["entry_point"] == "has_close_elements"
