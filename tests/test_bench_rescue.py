"""The rescue benchmark's plumbing on the fake backend (the real run is by hand: tests/benchmarks/bench_rescue.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
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
                             "--split", "dev", "--work", str(tmp_path), "--arms", *bench.ARMS, "--gate", "off", "--no-progress"])
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


def _reads_hints_after_the_problem(req) -> str:
    """A stand-in policy that uses a stated answer only when the hint is not before the problem (after it, or
    in the system message), as the issue's 0.5B policy mostly did; otherwise it answers wrong."""
    user = req.messages[-1]["content"]
    text = "\n".join(m["content"] for m in req.messages)
    m = re.search(r"The answer is ([^\s]+?)\.(?:\s|$)", text)
    if m and not user.startswith("Hint:"):
        return f"So the answer is \\boxed{{{m.group(1)}}}."
    return "I think it is \\boxed{-12345}."


@pytest.fixture
def reader_policy(monkeypatch):
    mod = types.ModuleType("_rescue_reader")
    mod.policy = _reads_hints_after_the_problem
    monkeypatch.setitem(sys.modules, "_rescue_reader", mod)
    return "_rescue_reader:policy"


def test_controls_that_do_not_separate_stop_the_run(bench, shared_data, tmp_path, capsys):
    """The echo policy uses nothing it is given: no placement separates, no hint arm is run."""
    args = bench.parse_args(["--backend", "fake", "--problems", "6", "--screen-k", "2", "--k", "2", "--split", "dev",
                             "--work", str(tmp_path), "--placements", "before", "after", "--no-progress", "--no-plot"])
    bench.run(args)
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    settings = [p for p in printed if p.get("step") == "setting"]
    assert [s["placement"] for s in settings] == ["before", "after"]
    assert all(s["verdict"] == "cannot show a hint effect" and s["control_half"]["rescued"] == 0 for s in settings)
    assert printed[-1]["step"] == "done" and printed[-1]["verdict"] == "cannot show a hint effect"
    assert not (tmp_path / "math-dev" / "hints" / "full").exists() and not (tmp_path / "math-dev" / "rescue").exists()


def test_the_placement_whose_controls_separate_is_the_one_the_arms_use(bench, shared_data, tmp_path, capsys, reader_policy):
    args = bench.parse_args(["--backend", "fake", "--fake-policy", reader_policy, "--problems", "8", "--screen-k", "2", "--k", "2",
                             "--split", "dev", "--work", str(tmp_path), "--placements", "before", "after", "system",
                             "--gate", "control_answer", "--arms", "generic", "reference", "--no-progress", "--no-plot"])
    lines = bench.run(args)
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    settings = {p["placement"]: p for p in printed if p.get("step") == "setting"}
    n = settings["before"]["problems"]
    assert n == 8
    assert settings["before"]["control_answer"]["rescued"] == 0 and settings["before"]["verdict"] == "cannot show a hint effect"
    for place in ("after", "system"):
        assert settings[place]["control_answer"]["rescued"] == n and settings[place]["uptake"] == 1.0
        assert settings[place]["separates"] and settings[place]["control_answer"]["vs_unhinted"]["ci95"][0] > 0
    # Tie between after and system: the first listed wins; every hint arm is re-rolled under it.
    assert [ln["arm"] for ln in lines] == ["unhinted", "generic", "reference"]
    assert {ln["placement"] for ln in lines} == {"after"}
    rolled = pl.read_parquet(tmp_path / "math-dev" / "rescue" / "rollouts" / "*.parquet")
    hinted = rolled.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == 2 * n * 2 and not hinted["prompt"].str.starts_with("Hint:").any()
    assert hinted["prompt"].str.contains("\n\nHint: ", literal=True).all()


def test_control_hints_come_from_the_reference_solution(bench):
    sol = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
    assert bench.control_text("math", "control_half", sol, "18") == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."
    assert bench.control_text("math", "control_answer", sol, "18") == (
        "Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = $18 every day. The answer is 18.")
    code = "    a = sorted(x)\n    b = a[::-1]\n    return b\n"
    assert bench.control_text("code", "control_half", code, "") == "A working solution starts:\n```python\n    a = sorted(x)\n```"
    assert bench.control_text("math", "control_answer", "", "18") is None


def test_quick_is_a_small_dev_run(bench):
    from mentor.stages.build_render import DEFAULT_PLACEMENT

    args = bench.parse_args(["--quick"])
    assert args.split == "dev" and args.problems == bench.QUICK_PROBLEMS and args.arms == list(bench.QUICK_ARMS)
    assert "full" in args.arms and "vouched" not in args.arms  # the method's own arm; vouching (3x its cost) by --arms
    assert args.work.endswith("quick") and args.placements == [DEFAULT_PLACEMENT] and args.gate == "control_half"


def test_the_default_work_folder_is_outside_the_repository(bench, monkeypatch, tmp_path):
    """The work folder (screens, hints, re-rolls: megabytes a run) goes to the mentor cache, never into the checkout."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # where a user runs the script from
    monkeypatch.delenv("MENTOR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    work = Path(bench.parse_args([]).work).resolve()
    assert work == (tmp_path / "xdg" / "mentor" / "bench" / "rescue").resolve() and repo not in work.parents
    monkeypatch.setenv("MENTOR_CACHE", str(tmp_path / "cache"))
    assert bench.parse_args(["--quick"]).work == str(tmp_path / "cache" / "bench" / "rescue" / "quick")
    assert bench.parse_args(["--work", "elsewhere"]).work == "elsewhere"  # an explicit --work is taken as given
