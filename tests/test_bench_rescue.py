"""The rescue benchmark's plumbing on the fake backend (the real run is by hand: tests/benchmarks/bench_rescue.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

BENCH = Path(__file__).parent / "benchmarks" / "bench_rescue.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_rescue", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("domain", ["math", "code"])
def test_every_arm_reports_a_line_on_the_same_problems(bench, shared_data, tmp_path, capsys, domain):
    args = bench.parse_args(["--backend", "fake", "--domain", domain, "--problems", "6", "--screen-k", "2", "--k", "2",
                             "--split", "dev", "--work", str(tmp_path), "--arms", *bench.ARMS])
    lines = bench.run(args)
    assert [ln["arm"] for ln in lines] == ["unhinted", *bench.ARMS]
    # The fake policy echoes the prompt: nothing is ever right, every problem collapses, nothing is rescued.
    assert {ln["problems"] for ln in lines} == {6} and {ln["rescued"] for ln in lines} == {0}
    for ln in lines[1:]:
        assert ln["check_hint_failures"] == 0
        assert ln["vs_unhinted"] == {"diff": 0.0, "ci95": [0.0, 0.0], "b": 0, "c": 0, "p_mcnemar": 1.0}
    by_arm = {ln["arm"]: ln for ln in lines}
    assert by_arm["generic"]["hint_tokens_per_problem"] == 0 and by_arm["full"]["hint_tokens_per_problem"] > 0
    assert by_arm["full"]["hint_tokens_per_problem"] > by_arm["no_judgment"]["hint_tokens_per_problem"]
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert printed[0]["step"] == "screen" and printed[0]["collapsed"] == 6 and any("plot" in p for p in printed)
    work = tmp_path / f"{domain}-dev"
    assert (work / "rescue.png").stat().st_size > 1000
    ref = pl.read_parquet(work / "hints" / "reference" / "hints.parquet")
    assert ref.height == 6 and ref["hint"].str.starts_with("A ").sum() >= 4  # from the reference solution, not generic
    # Rerunning computes nothing new (every stage is resumable).
    again = bench.run(args)
    assert [ln["rescued"] for ln in again] == [ln["rescued"] for ln in lines]
    assert all(ln["hint_stage"]["computed_now"] == 0 for ln in again if ln["arm"] not in ("unhinted", "reference"))


def test_paired_statistics(bench):
    x = [True] * 10 + [False] * 10
    y = [False] * 10 + [False] * 10
    p = bench.paired(x, y)
    assert p["diff"] == 0.5 and p["b"] == 10 and p["c"] == 0 and p["p_mcnemar"] < 0.01
    assert p["ci95"][0] > 0.2 and p["ci95"][1] <= 0.8
    assert bench.mcnemar_p(3, 3) == 1.0
    assert bench.reference_candidates("math", "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18") == [
        "A first step: Janet sells 16 - 3 - 4 = 9 duck eggs a day.", "A first step: Janet sells 16 - 3 - 4."]


@pytest.mark.parametrize("spec, message", [
    ("full=cfg.yaml", "arm 'full' is already in the run"),
    ("unhinted=cfg.yaml", "arm 'unhinted' is already in the run"),
    ("cfg.yaml", "expected NAME=HINT.YAML"),
])
def test_an_arm_config_that_collides_or_has_no_name_is_refused(bench, capsys, spec, message):
    with pytest.raises(SystemExit):
        bench.parse_args(["--arms", "generic", "full", "--arm-config", spec])
    assert message in capsys.readouterr().err


def test_an_arm_config_under_its_own_name_is_taken(bench):
    args = bench.parse_args(["--arms", "generic", "--arm-config", "full=cfg.yaml"])
    assert args.arms == ["generic"] and args.arm_config == {"full": "cfg.yaml"}


def test_two_arm_configs_under_one_name_are_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--arms", "generic", "--arm-config", "v=a.yaml", "--arm-config", "v=b.yaml"])
    assert "arm 'v' is already in the run" in capsys.readouterr().err
