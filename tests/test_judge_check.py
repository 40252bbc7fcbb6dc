"""The judge check (stages/hint/judge_check.py) on the real bundled GSM8K collapsed set, with scripted judges.

A judge that cannot tell good from bad (one that approves everything, one that calls
everything incorrect, one whose output never parses) must be found out, and the run
then judges by the rules alone; a judge that can (a careful scripted one) is trusted and
used. Everything goes through the run's own judgment requests and the real rules.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from types import SimpleNamespace

import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline.errors import ConfigError, DataError, EngineError
from mentor.pipeline.backends.fake import FakeBackend
from mentor.pipeline.llm import GenRequest
from mentor.pipeline.stage import Context
from mentor.stages.hint import agents
from mentor.stages.hint import HINT as HINT_STAGE
from mentor.stages.hint.config import HintConfig
from mentor.stages.rules import check
from mentor.stages.hint.judge_check import calibration_set, change_a_number, check_judge, first_step, int_words, load_solutions

ATTR = '{"keywords": ["eggs left to sell"], "error": "The attempts price all the eggs."}'
HINT = '{"hint": "Work out how many of the items are left before you multiply by the price of each one."}'


def _parts(req: GenRequest) -> tuple[str, str, str]:
    user = req.messages[-1]["content"]
    problem = user.split("Problem:\n", 1)[1].split("\n\nReference answer", 1)[0]
    answer = user.split("(the hint must not reveal it): ", 1)[1].split("\n", 1)[0]
    hint = user.split("Hint to review:\n", 1)[1].rsplit("\n\nReply with", 1)[0].strip()
    return problem, answer, hint


_EQ = re.compile(r"([\d\s.+\-*/()x×]+)=\s*\$?(\d+(?:\.\d+)?)")


def _arithmetic_holds(hint: str) -> bool:
    """Every `a op b = c` of the hint whose left side is plain arithmetic is true."""
    for lhs, rhs in _EQ.findall(hint.replace("$", "").replace(",", "")):
        expr = lhs.replace("x", "*").replace("×", "*").strip()
        if not re.search(r"\d\s*[-+*/]\s*\d", expr):
            continue
        try:
            value = eval(re.sub(r"(\d+(?:\.\d+)?)", r"Fraction('\1')", expr), {"Fraction": Fraction})  # digits and operators only
        except (SyntaxError, ZeroDivisionError, TypeError):
            continue
        if value != Fraction(rhs):
            return False
    return True


def careful_judge(req: GenRequest) -> str:
    """A judge that can tell: false arithmetic, the answer (any form, mentor's rules) or a restatement -> rejected."""
    if "score" not in (req.json_schema or {}).get("properties", {}):
        return ATTR if "keywords" in (req.json_schema or {}).get("properties", {}) else HINT
    problem, answer, hint = _parts(req)
    bad = check(hint, domain="math", answer=answer, problem=problem).violations
    if not _arithmetic_holds(hint):
        return '{"correct": false, "score": 2, "feedback": "A calculation is wrong."}'
    if bad:
        return '{"correct": true, "score": 3, "feedback": "It gives the answer away or restates the problem."}'
    return '{"correct": true, "score": 8, "feedback": "A true first step."}'


def approves_everything(req: GenRequest) -> str:
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return ATTR
    return '{"correct": true, "score": 8, "feedback": "Fine."}' if "score" in props else HINT


def rejects_everything(req: GenRequest) -> str:
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return ATTR
    return '{"correct": false, "score": 3, "feedback": "Incorrect."}' if "score" in props else HINT


def never_parses(req: GenRequest) -> str:
    props = (req.json_schema or {}).get("properties", {})
    if "keywords" in props:
        return ATTR
    return "I think this hint is quite good" if "score" in props else HINT


class Factory:
    """A backend factory that counts the engines it made."""

    def __init__(self, script) -> None:
        self.fake = FakeBackend(script=script)
        self.made = 0

    def __call__(self) -> FakeBackend:
        self.made += 1
        return self.fake

    def describe(self) -> dict:
        return {"kind": "fake", "script": getattr(self.fake.script, "__name__", "script")}


@pytest.fixture(scope="module")
def rows(gsm8k_collapsed):
    return pq.read_table(gsm8k_collapsed).sort_by("problem_id").to_pylist()


# --------------------------------------------------------------------------- the calibration set


def test_calibration_set_from_real_gsm8k_problems(rows):
    items = calibration_set(rows, HintConfig(), load_solutions(None))
    by_id = {r["problem_id"]: r for r in rows}
    assert len({it.problem_id for it in items}) == 8 and len(items) == 32
    assert [it.kind for it in items[:4]] == ["good", "number_changed", "answer_in_words", "restatement"]
    for it in items:
        r = by_id[it.problem_id]
        verdict = check(it.hint, domain="math", answer=r["label"], problem=r["problem"])
        if it.kind == "good":
            assert verdict.ok, (it.hint, verdict.violations)  # a known-good hint passes the rules
            assert it.hint.startswith("A first step: ")
        elif it.kind == "answer_in_words":
            assert "answer_leak" in verdict.violations, it.hint
    goods = {it.problem_id: it.hint for it in items if it.kind == "good"}
    for it in items:
        if it.kind == "number_changed":
            g = goods[it.problem_id]
            assert it.hint != g and re.sub(r"\d+", "#", it.hint) == re.sub(r"\d+", "#", g)


def test_reference_steps_and_words():
    sol = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
    assert first_step(sol) == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."
    assert first_step("First find the area. Then divide.") == "First find the area."
    assert change_a_number("A first step: 16 - 3 - 4 = 9 eggs.", "18") == "A first step: 16 - 3 - 4 = 11 eggs."
    assert change_a_number("A first step: 16 - 3 - 4 = 16 eggs.", "18") != "A first step: 16 - 3 - 4 = 18 eggs."
    assert [int_words(n) for n in (0, 18, 40, 105, 9360, 2_880_000)] == [
        "zero", "eighteen", "forty", "one hundred five", "nine thousand three hundred sixty", "two million eight hundred eighty thousand"]


# --------------------------------------------------------------------------- the judge on it


def test_one_engine_call_with_the_runs_own_judgment_requests(rows):
    cfg = HintConfig()
    fake = FakeBackend(script=careful_judge)
    report = check_judge(rows, cfg, fake)
    assert fake.calls == 1 and len(fake.log[0]) == report["items"] == 32
    t = agents.Templates.load()
    by_id = {r["problem_id"]: r for r in rows}
    for req, v in zip(fake.log[0], report["verdicts"]):
        state = SimpleNamespace(row=by_id[v["problem_id"]], candidate=v["hint"])  # what the judgment agent reads
        assert req.messages == agents.JUDGMENT.messages(state, cfg, t)
        assert req.json_schema == agents.JUDGMENT.schema(cfg, cfg.for_domain("math")[3])
        assert (req.max_tokens, req.temperature) == (cfg.max_tokens.judgment, cfg.analysis_temperature)
        assert req.id.split(":")[1] == "judgment"
    assert report["status"] == "trusted" and report["action"] == "judge"
    assert report["balanced_accuracy"] >= 0.9, report
    assert report["prompt_tokens"] == fake.prompt_tokens and report["engine_calls"] == 1


@pytest.mark.parametrize("judge", [approves_everything, rejects_everything, never_parses])
def test_a_judge_that_cannot_tell_is_found_out(rows, judge):
    report = check_judge(rows, HintConfig(), FakeBackend(script=judge))
    assert report["balanced_accuracy"] == 0.5 and report["status"] == "untrusted" and report["action"] == "rules_only"
    if judge is never_parses:
        assert report["parse_failures"] == 32
    assert report["good"]["n"] == 8 and report["bad"]["n"] == 24


def test_the_threshold_is_the_configs(rows):
    # The careful judge accepts every good hint; raise the bar above what it reached and it is not trusted.
    first = check_judge(rows, HintConfig(), FakeBackend(script=careful_judge))
    ba = first["balanced_accuracy"]
    if ba < 1.0:
        strict = HintConfig(judge_check={"min_balanced_accuracy": min(1.0, ba + 0.01)})
        assert check_judge(rows, strict, FakeBackend(script=careful_judge))["status"] == "untrusted"
    lenient = HintConfig(judge_check={"min_balanced_accuracy": 0.5})
    assert check_judge(rows, lenient, FakeBackend(script=approves_everything))["status"] == "trusted"


# --------------------------------------------------------------------------- within a hint run


def test_an_untrusted_judge_is_replaced_by_the_rules_for_the_run(gsm8k_collapsed, tmp_path, caplog):
    factory = Factory(approves_everything)
    with caplog.at_level("WARNING", logger="mentor.stages.hint.judge_check"):
        st = HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 5}, HintConfig(), tmp_path / "h", Context(backend=factory))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cannot tell good hints from bad" in lines[0] and "rules alone" in lines[0]
    # one calibration call, then attribution and generation only: no judgment request in the run
    agents_asked = [{r.id.split(":")[1] for r in call} for call in factory.fake.log]
    assert agents_asked[0] == {"judgment"} and all("judgment" not in a for a in agents_asked[1:])
    assert st.judge_calls == 0 and st.accepted == 5
    stats = json.loads((tmp_path / "h" / "stats.json").read_text())
    assert stats["judge_check"]["status"] == "untrusted" and stats["judge_check"]["balanced_accuracy"] == 0.5
    assert "verdicts" not in stats["judge_check"]
    assert stats["config"]["llm_judge"] is True  # the config as given; the check's action says what ran
    saved = json.loads((tmp_path / "h" / "judge_check.json").read_text())["report"]
    assert len(saved["verdicts"]) == 32 and all(v["raw"] for v in saved["verdicts"])
    # `mentor inspect` shows the check, and a problem's trace
    from mentor.workflows.report import inspect_path, problem_history

    shown = inspect_path(tmp_path / "h")["judge_check"]
    assert shown["status"] == "untrusted" and shown["balanced_accuracy"] == 0.5
    assert shown["bad_rejected_by_kind"] == {"number_changed": "0/8", "answer_in_words": "0/8", "restatement": "0/8"}
    pid = pl.read_parquet(tmp_path / "h" / "hints.parquet")["problem_id"][0]
    assert [e["agent"] for e in problem_history(tmp_path / "h", pid)["trace"]] == ["attribution", "generation", "rules"]
    # A rerun reuses the check and every shard: no engine at all.
    again = Factory(approves_everything)
    HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 5}, HintConfig(), tmp_path / "h", Context(backend=again))
    assert again.made == 0 and again.fake.calls == 0
    assert json.loads((tmp_path / "h" / "stats.json").read_text())["judge_check"]["reused"] is True


def test_a_trusted_judge_judges_the_run(gsm8k_collapsed, tmp_path):
    factory = Factory(careful_judge)
    st = HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 5}, HintConfig(), tmp_path / "h", Context(backend=factory))
    assert st.judge_calls == 5
    stats = json.loads((tmp_path / "h" / "stats.json").read_text())
    assert stats["judge_check"]["status"] == "trusted"
    assert stats["this_run"]["engine_calls"] == 1 + stats["engine_calls"]


def test_keep_judge_and_error_and_off(gsm8k_collapsed, tmp_path):
    st = HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 3}, HintConfig(judge_check={"on_fail": "keep_judge"}),
              tmp_path / "k", Context(backend=Factory(approves_everything)))
    assert st.judge_calls == 3
    with pytest.raises(ConfigError, match=r"^judge check: balanced accuracy 0\.5 .*judge_check\.on_fail: error"):
        HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 3}, HintConfig(judge_check={"on_fail": "error"}),
             tmp_path / "e", Context(backend=Factory(approves_everything)))
    assert not (tmp_path / "e" / "hints.parquet").exists()
    for cfg in (HintConfig(judge_check={"enabled": False}), HintConfig(llm_judge=False, max_refine=0)):
        f = Factory(approves_everything)
        HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 3}, cfg, tmp_path / f"off{cfg.llm_judge}", Context(backend=f))
        assert not any(all(r.id.split(":")[1] == "judgment" for r in call) and len(call) == 32 for call in f.fake.log)
        assert json.loads((tmp_path / f"off{cfg.llm_judge}" / "stats.json").read_text())["judge_check"] is None


def test_without_reference_solutions_the_judge_is_used_unchecked(gsm8k_collapsed, tmp_path, caplog):
    other = (pl.read_parquet(gsm8k_collapsed).head(4).drop("solution", strict=False)  # mine carried the solutions: no longer
             .with_columns(pl.concat_str(pl.lit("x-"), pl.col("problem_id")).alias("problem_id")))
    src = tmp_path / "c.parquet"
    other.write_parquet(src)
    f = Factory(approves_everything)
    with caplog.at_level("WARNING", logger="mentor.stages.hint.judge_check"):
        st = HINT_STAGE({"collapsed": [src]}, HintConfig(), tmp_path / "h", Context(backend=f))
    assert st.judge_calls == 4 and "not run" in caplog.records[0].getMessage()
    assert json.loads((tmp_path / "h" / "stats.json").read_text())["judge_check"]["status"] == "unchecked"
    # ... and a solutions file gives them (JSONL, problem_id + solution)
    sols = load_solutions(None)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"problem_id": "x-" + p, "solution": sols[p]}) + "\n"
                                              for p in pl.read_parquet(gsm8k_collapsed).head(4)["problem_id"]))
    cfg = HintConfig(judge_check={"solutions": str(tmp_path / "s.jsonl")})
    assert check_judge(pq.read_table(src).to_pylist(), cfg, FakeBackend(script=careful_judge))["items"] == 16


def test_an_engine_failure_in_the_check_is_one_clear_error(gsm8k_collapsed, tmp_path):
    def dies(req):
        raise EngineError("the vLLM engine died (EngineDeadError)")

    with pytest.raises(EngineError, match=r"^hint: the judge check \(32 calibration hints from 8 problems\) failed before any "
                                          r"shard ran: the vLLM engine died .*Rerun the same command"):
        HINT_STAGE({"collapsed": [gsm8k_collapsed], "sample": 2}, HintConfig(), tmp_path / "h", Context(backend=Factory(dies)))


def test_check_judge_command(gsm8k_collapsed, tmp_path):
    out = tmp_path / "report.json"
    r = CliRunner().invoke(cli, ["check-judge", str(gsm8k_collapsed), "--backend", "fake", "--problems", "3", "--out", str(out)])
    assert r.exit_code == 1, r.output  # the canned fake judge approves everything: not trusted
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["balanced_accuracy"] == 0.5 and report["items"] == 12 and report["status"] == "untrusted"
    assert len(json.loads(out.read_text())["verdicts"]) == 12


def test_solutions_file_errors(tmp_path, rows):
    (tmp_path / "s.jsonl").write_text('{"id": "a", "text": "b"}\n')
    with pytest.raises(DataError, match=r"s\.jsonl: judge_check\.solutions lacks column\(s\) \['problem_id', 'solution'\]"):
        load_solutions(str(tmp_path / "s.jsonl"))
    with pytest.raises(ConfigError, match=r"nope\.parquet: judge_check\.solutions file not found"):
        load_solutions(str(tmp_path / "nope.parquet"))


def test_bundled_solutions_are_gsm8ks_as_converted(shared_data, tmp_path):
    from mentor.data import bundled
    from mentor.data.convert_solutions import convert

    outs = convert(shared_data, tmp_path)
    for out in outs:  # GSM8K, MATH-500, HumanEval: the bundled files are these conversions
        assert out.read_bytes() == bundled(out.name).read_bytes()
    sols = load_solutions(None)
    for name, n in (("gsm8k", 1319), ("math500", 500), ("humaneval", 164)):  # every bundled problem has one
        ids = set(pl.read_parquet(bundled(f"{name}_problems.parquet"))["problem_id"])
        assert len(ids) == n and ids <= set(sols)
    assert len(sols) == 1319 + 500 + 164
    problems = pl.read_parquet(bundled("gsm8k_problems.parquet"))
    sols = {p: s for p, s in sols.items() if p in set(problems["problem_id"])}
    # each solution ends with GSM8K's answer line, the bundled label
    label = dict(problems.select("problem_id", "label").iter_rows())
    assert all(s.rsplit("####", 1)[-1].strip().replace(",", "") == label[p].replace(",", "") for p, s in sols.items())
