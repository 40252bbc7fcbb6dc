"""The rescue benchmark's plumbing on the fake backend (the real run is by hand: tests/benchmarks/bench_rescue.py)."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import polars as pl
import pytest

BENCH = Path(__file__).parent / "benchmarks" / "bench_rescue.py"


@pytest.mark.parametrize("domain", ["math", "code"])
def test_every_arm_reports_a_line_on_the_same_problems(bench, shared_data, tmp_path, capsys, domain):
    args = bench.parse_args(["--backend", "fake", "--domain", domain, "--problems", "6", "--screen-k", "2", "--k", "2",
                             "--split", "dev", "--work", str(tmp_path), "--arms", *bench.ARMS, "--gate", "off", "--no-progress"])
    lines = bench.run(args)
    assert [ln["arm"] for ln in lines] == ["unhinted", "neutral", "control_first_step", "control_half", *bench.ARMS]
    # The fake policy echoes the prompt: nothing is ever right, every problem collapses, nothing is rescued.
    assert {ln["problems"] for ln in lines} == {6} and {ln["rescued"] for ln in lines} == {0}
    for ln in lines[1:]:
        assert ln["vs_unhinted"] == {"diff": 0.0, "ci95": [0.0, 0.0], "b": 0, "c": 0, "p_mcnemar": 1.0}
        assert ln["per_problem_vs_unhinted"] == {"diff": 0.0, "ci95": [0.0, 0.0], "better": 0, "worse": 0, "p_wilcoxon": 1.0}
    for ln in lines[4:]:
        assert ln["check_hint_failures"] == 0 and "per_problem_vs_neutral" in ln and ln["beats_unhinted_and_neutral"] is False
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
    assert all(ln["hint_stage"]["computed_now"] == 0 for ln in again if ln["arm"] in bench.ARMS and ln["arm"] != "reference")


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


def _moved_by_any_hint_text(req) -> str:
    """A stand-in policy moved by any text added after the problem, whatever it says (what LoPE saw with neutral
    text): it answers right whenever a hint block is there."""
    user = req.messages[-1]["content"]
    if "\n\nHint: " in user:
        return "So it is \\boxed{%s}." % _LABELS[user.split("\n\n")[0]]
    return "I think it is \\boxed{-12345}."


def test_a_control_that_beats_unhinted_but_not_the_neutral_filler_does_not_open_the_gate(bench, shared_data, tmp_path,
                                                                                        capsys, monkeypatch):
    """Text of the same length in the same place does as much as the control: the setting cannot show a hint effect."""
    from mentor.data import BUNDLED_SETS, bundled

    _LABELS.update(dict(pl.read_parquet(bundled(BUNDLED_SETS["gsm8k"])).select("problem", "label").iter_rows()))
    mod = types.ModuleType("_rescue_moved")
    mod.policy = _moved_by_any_hint_text
    monkeypatch.setitem(sys.modules, "_rescue_moved", mod)
    args = bench.parse_args(["--backend", "fake", "--fake-policy", "_rescue_moved:policy", "--problems", "8", "--screen-k", "2",
                             "--k", "2", "--split", "dev", "--work", str(tmp_path), "--gate", "control_first_step",
                             "--no-progress", "--no-plot"])
    bench.run(args)
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    (setting,) = [p for p in printed if p.get("step") == "setting"]
    first = setting["control_first_step"]
    # the control "rescues" every problem against no hint, and so does the neutral filler in the same place
    assert first["rescued"] == setting["problems"] == 8 and first["per_problem_vs_unhinted"]["ci95"][0] > 0
    assert setting["neutral"]["rescued"] == 8 and first["per_problem_vs_neutral"]["ci95"] == [0.0, 0.0]
    assert not setting["separates"] and printed[-1]["verdict"] == "cannot show a hint effect"


_LABELS: dict[str, str] = {}


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
    assert [ln["arm"] for ln in lines] == ["unhinted", "neutral", "control_first_step", "control_half", "generic", "reference"]
    assert {ln["placement"] for ln in lines} == {"after"}
    rolled = pl.read_parquet(tmp_path / "math-dev" / "rescue" / "rollouts" / "*.parquet")
    hinted = rolled.filter(pl.col("hint_id").is_not_null())
    assert hinted.height == 5 * n * 2 and not hinted["prompt"].str.starts_with("Hint:").any()
    assert hinted["prompt"].str.contains("\n\nHint: ", literal=True).all()


def test_control_hints_come_from_the_reference_solution(bench):
    sol = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
    assert bench.control_text("math", "control_half", sol, "18") == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."
    assert bench.control_text("math", "control_first_step", sol + "\nA third line.", "18") == (
        "Janet sells 16 - 3 - 4 = 9 duck eggs a day.")
    assert bench.control_text("math", "control_answer", sol, "18") == (
        "Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = $18 every day. The answer is 18.")
    code = "    a = sorted(x)\n    b = a[::-1]\n    return b\n"
    assert bench.control_text("code", "control_half", code, "") == "A working solution starts:\n```python\n    a = sorted(x)\n```"
    assert bench.control_text("math", "control_answer", "", "18") is None


def test_quick_is_a_small_dev_run(bench):
    from mentor.stages.build_render import DEFAULT_TOKENIZED_PLACEMENT

    args = bench.parse_args(["--quick"])
    assert args.split == "dev" and args.problems == bench.QUICK_PROBLEMS and args.arms == list(bench.QUICK_ARMS)
    assert "full" in args.arms and "vouched" not in args.arms  # the method's own arm; vouching (3x its cost) by --arms
    assert args.work.endswith("quick") and args.placements == [DEFAULT_TOKENIZED_PLACEMENT] and args.gate == "control_half"


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


def test_neutral_filler_is_as_long_as_the_hint_it_stands_in_for(bench):
    import pyarrow as pa

    from mentor.pipeline.schemas import HINTS

    rows = [{"problem_id": f"p{i}", "round": 0, "hint_id": f"h{i}", "hint": "x" * n, "keywords": [], "error": None,
             "status": "accepted", "retries": 0, "refines": 0, "judge_score": None, "violations": [], "trace": [],
             "model": "m", "prompt_version": "v", "config_hash": "c"} for i, n in enumerate((12, 60, 150, 400))]
    out = bench.neutral_hints(pa.Table.from_pylist(rows, schema=pa.schema(list(HINTS))), "math").to_pylist()
    for r, n in zip(out, (12, 60, 150, 400)):
        assert abs(len(r["hint"]) - n) <= 12 and not any(ch.isdigit() for ch in r["hint"])  # no content, no numbers
        assert bench.FILLER.startswith(r["hint"][:10])


def test_per_problem_endpoint_and_wilcoxon(bench):
    import itertools

    # exact Wilcoxon signed-rank: five positive differences -> 2/32 two-sided
    assert bench.wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5]) == 2 / 32
    assert bench.wilcoxon_p([0.0, 0.0]) == 1.0
    # with ties and zeros: the dynamic programme equals brute force over every sign assignment
    d = [0.25, -0.25, 0.5, 0.5, 0.0, 0.75, -0.125, 0.25]
    nz = [x for x in d if x]
    ranks = {v: (sum(1 for y in nz if abs(y) < abs(v)) + 1 + sum(1 for y in nz if abs(y) <= abs(v))) / 2 for v in nz}
    w = sum(ranks[v] for v in nz if v > 0)
    sums = [sum(ranks[v] for v, s in zip(nz, signs) if s) for signs in itertools.product((0, 1), repeat=len(nz))]
    brute = min(1.0, 2 * min(sum(x <= w for x in sums), sum(x >= w for x in sums)) / len(sums))
    assert abs(bench.wilcoxon_p(d) - brute) < 1e-12
    # the endpoint: mean of per-problem differences, with a paired interval
    x = [0.5] * 20 + [0.0] * 20
    y = [0.0] * 40
    pp = bench.per_problem(x, y)
    assert pp["diff"] == 0.25 and pp["better"] == 20 and pp["worse"] == 0 and pp["p_wilcoxon"] < 1e-4
    assert 0.1 < pp["ci95"][0] < 0.25 < pp["ci95"][1] < 0.4
    # large n takes the normal approximation, close to the exact value where both apply
    big = [0.1 * ((i % 7) - 2) for i in range(80)]
    assert 0 < bench.wilcoxon_p(big) < 1


def test_wordings_rerolls_each_hint_arm_once_per_opening(bench, shared_data, tmp_path, monkeypatch):
    """--wordings: one rescue run whose arms are each hint arm under each opening of the answer (and other placements)."""
    from tiny_model import make_tiny_llama  # noqa: F401  (the tokenizer is the embedded model's)
    from mentor.pipeline.models import ensure_embedded_model

    tok = str(ensure_embedded_model())
    import mentor.stages.rollout as rollout

    monkeypatch.setattr(rollout, "policy_tokenizer", lambda backend: tok)
    args = bench.parse_args(["--backend", "fake", "--problems", "4", "--screen-k", "2", "--k", "2", "--split", "dev",
                             "--work", str(tmp_path), "--arms", "reference", "--controls", "--wordings", "bare", "labelled",
                             "after", "--gate", "off", "--placement", "assistant", "--no-progress", "--no-plot"])
    lines = bench.run(args)
    assert [ln["arm"] for ln in lines] == ["unhinted", "neutral", "reference_bare", "reference_labelled", "reference_after"]
    by = {ln["arm"]: ln for ln in lines}
    assert by["reference_bare"]["placement"] == "assistant" and by["reference_bare"]["answer_template"] == "{hint}\n\n"
    assert by["reference_labelled"]["answer_template"] == "Hint: {hint}\n\n" and by["reference_after"]["placement"] == "after"
    rolled = pl.read_parquet(tmp_path / "math-dev" / "rescue" / "rollouts" / "*.parquet")
    k = 2
    arm_of = {i: a for i, a in enumerate(["unhinted", *list(by)[1:]])}
    rolled = rolled.with_columns(pl.col("sample_idx").floordiv(k).replace_strict(arm_of, return_dtype=pl.String).alias("arm"))
    hints = dict(pl.read_parquet(tmp_path / "math-dev" / "hints" / "reference" / "hints.parquet").select("problem_id", "hint").iter_rows())
    seen = {a: dict(rolled.filter(pl.col("arm") == a).select("problem_id", "prompt").iter_rows()) for a in by}
    assert len(seen["reference_bare"]) == 4
    for pid, hint in hints.items():
        # the prompt as sent: the policy's chat template, the answer opened with the hint and left open
        assert seen["reference_bare"][pid].startswith("<|im_start|>")
        assert seen["reference_bare"][pid].endswith(f"<|im_start|>assistant\n{hint}\n\n")
        assert seen["reference_labelled"][pid].endswith(f"<|im_start|>assistant\nHint: {hint}\n\n")
        assert f"\n\nHint: {hint}" in seen["reference_after"][pid] and "<|im_start|>" not in seen["reference_after"][pid]
        # the unhinted arm of the same run: rendered too, with the generation prompt (what a trainer renders)
        assert seen["unhinted"][pid].endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_offset_and_rows_select_problems_by_position_in_the_split(bench):
    whole = bench.split_problems("math", "report", None)
    part = bench.split_problems("math", "report", 200, offset=400)
    assert part["problem_id"].to_list() == whole["problem_id"].to_list()[400:600]
    args = bench.parse_args(["--offset", "400", "--rows", "200"])
    assert (args.offset, args.problems) == (400, 200)
    with pytest.raises(SystemExit, match="the report split has 659 problems"):
        bench.split_problems("math", "report", 10, offset=659)


def test_screen_only_stops_after_the_screen_in_its_own_folder(bench, shared_data, tmp_path, capsys):
    args = bench.parse_args(["--backend", "fake", "--offset", "400", "--rows", "4", "--screen-k", "2", "--screen-only",
                             "--work", str(tmp_path), "--no-progress"])
    assert bench.run(args) == []
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [p["step"] for p in printed] == ["screen"] and printed[0]["problems"] == 4
    work = tmp_path / "math-report-from400"
    assert (work / "collapsed" / "selected.parquet").exists() and not (work / "hints").exists()


def test_screen_from_that_selects_nothing_is_refused(bench, shared_data, tmp_path):
    first = tmp_path / "first.parquet"
    bench.split_problems("math", "report", 2).select("problem_id").write_parquet(first)
    args = bench.parse_args(["--backend", "fake", "--offset", "400", "--rows", "4", "--screen-from", str(first),
                             "--work", str(tmp_path), "--no-progress"])
    with pytest.raises(SystemExit, match="none of its problem_ids"):
        bench.run(args)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_bench_and_its_child_processes_within_seconds(tmp_path, sig):
    """The stop path of a real run (the engine's processes are the bench's children), with a child that ignores
    SIGTERM standing in for a slow engine: the bench reports the stop and is gone within seconds."""
    import signal
    import subprocess
    import time

    import psutil

    script = tmp_path / "run.py"
    script.write_text(
        "import importlib.util, subprocess, sys, time\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(BENCH)!r}); b = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(b); b._stop_on_interrupt()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
        "signal.SIG_IGN); print(1, flush=True); time.sleep(600)'], stdout=subprocess.PIPE)\n"
        "child.stdout.readline(); print('ready', child.pid, flush=True)\n"
        "time.sleep(600)  # a blocking call, as vLLM's sampling loop can be\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready"
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    rc = proc.wait(timeout=30)
    assert time.monotonic() - t0 < 10 and rc == 128 + getattr(signal, sig)
    assert json.loads(proc.stdout.readline()) | {} == {"bench": "rescue", "step": "stopped", "signal": sig,
                                                       "note": "rerun the same command to resume"}
    time.sleep(0.5)
    try:  # the child that ignored SIGTERM was killed (gone, or a zombie until its new parent reaps it)
        assert psutil.Process(int(ready[1])).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_missing_shared_data_is_a_clear_stop_not_a_traceback(bench, monkeypatch, tmp_path):
    monkeypatch.setenv("MENTOR_SHARED_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="set MENTOR_SHARED_DATA"):
        bench.reference_solutions("math")
