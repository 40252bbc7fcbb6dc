"""Policy vouching (stages/hint/vouch.py): the state machine over candidates, with scripted hinter and policy.

The hint stage and the rules are real, the verifier is mentor's math verifier and the
prompts are build's layout; only the two models are scripted: the policy "solves" a
problem when its prompt carries a hint with a word the test chooses.
"""

from __future__ import annotations

import json

import polars as pl
import pyarrow.parquet as pq
import pytest

from mentor.pipeline.backends.fake import FakeBackend
from mentor.pipeline.llm import GenRequest
from mentor.pipeline.prompts import INSTRUCTIONS
from mentor.pipeline.schemas import check_schema
from mentor.pipeline.stage import Context
from mentor.stages.build_render import prompt_messages
from mentor.stages.hint.machine import HintStats
from mentor.stages.hint import HINT
from mentor.stages.hint.config import HintConfig
from mentor.stages.rollout import problem_seed
from mentor.stages.hint.vouch import reroll_seed, vouch_shard

ATTR = '{"keywords": ["items left"], "error": "The attempts use every item instead of the ones left."}'
# Candidate n of a problem (generation attempt n): the first is vague, the later ones name the step.
HINTS = [
    "Read the question again and decide which quantity it asks for before computing anything.",
    "Subtract what is used at home from the total first; only the remainder is sold.",
    "Count the remainder after the home uses, then multiply that remainder by the price.",
]


def hinter(judge_scores=(8, 8, 8)):
    """Candidate n+1 is HINTS[n]; the judge scores each candidate as `judge_scores` says."""

    def script(req: GenRequest) -> str:
        props = (req.json_schema or {}).get("properties", {})
        user = req.messages[-1]["content"]
        # the escalation prompt names the last previous hint: write the one after it
        n = 1 + max((i for i, h in enumerate(HINTS) if h in user), default=-1)
        if "keywords" in props:
            return ATTR
        if "score" in props:
            hint = user.split("Hint to review:\n", 1)[1]
            k = next(i for i, h in enumerate(HINTS) if h in hint)
            return json.dumps({"correct": True, "score": judge_scores[k], "feedback": "ok"})
        return json.dumps({"hint": HINTS[min(n, len(HINTS) - 1)]})

    return FakeBackend(script=script)


def policy(solves_with: str | None, labels: dict[str, str]):
    """Correct (\\boxed{answer}) when the prompt's hint contains `solves_with`, else a wrong answer."""

    def script(req: GenRequest) -> str:
        text = "\n".join(m["content"] for m in req.messages)
        answer = next(a for p, a in labels.items() if p in text)
        if solves_with is not None and solves_with in text:
            return f"So the result is \\boxed{{{answer}}}."
        return "So the result is \\boxed{123456789}."

    return FakeBackend(script=script)


@pytest.fixture(scope="module")
def rows(gsm8k_collapsed):
    return pq.read_table(gsm8k_collapsed).sort_by("problem_id").slice(0, 3).to_pylist()


def _labels(rows):
    return {r["problem"]: r["label"] for r in rows}


def cfg(**vouch):
    return HintConfig(judge_check={"enabled": False}, vouch={"samples": 2, "candidates": 3, **vouch})


def test_the_first_candidate_that_earns_reward_is_kept(rows):
    pol, hint = policy("Read the question", _labels(rows)), hinter()
    st = HintStats()
    t = vouch_shard(rows, cfg(), hint, stats=st, policy=pol).to_pylist()
    assert [r["hint"] for r in t] == [HINTS[0]] * 3
    assert all(r["vouch"] == {"candidates": 1, "kept": 0, "samples": 2, "correct": 2, "rescued": True} for r in t)
    assert pol.calls == 1 and len(pol.log[0]) == 3 * 2
    assert st.vouch["rescued"] == 3 and st.vouch["rescued_by_first"] == 3 and st.vouch["candidates"] == 3


def test_an_unvouched_hint_escalates_to_the_next_candidate(rows):
    pol, hint = policy("Subtract what is used", _labels(rows)), hinter()
    st = HintStats()
    t = vouch_shard(rows, cfg(), hint, stats=st, policy=pol).to_pylist()
    assert [r["hint"] for r in t] == [HINTS[1]] * 3
    assert all(r["vouch"]["candidates"] == 2 and r["vouch"]["kept"] == 1 and r["vouch"]["rescued"] for r in t)
    # candidate 2 was written from the escalation prompt that names candidate 1
    gens = [r for call in hint.log for r in call if r.id.split(":")[1] == "generation"]
    assert sum(HINTS[0] in r.messages[-1]["content"] for r in gens) == 3
    # the trace holds both candidates, each closed by its re-roll verdict
    vouch_entries = [json.loads(e["parsed"]) for e in t[0]["trace"] if e["agent"] == "vouch"]
    assert [v["correct"] for v in vouch_entries] == [0, 2]
    assert [e["agent"] for e in t[0]["trace"]].count("generation") == 2
    assert pol.calls == 2 and st.vouch["candidates"] == 6 and st.vouch["rescued_by_first"] == 0


def test_no_rescue_keeps_the_best_judged_candidate_unrescued(rows):
    pol, hint = policy(None, _labels(rows)), hinter(judge_scores=(7, 9, 8))
    t = vouch_shard(rows, cfg(), hint, policy=pol).to_pylist()
    assert [r["hint"] for r in t] == [HINTS[1]] * 3 and [r["judge_score"] for r in t] == [9.0] * 3
    assert all(r["vouch"] == {"candidates": 3, "kept": 1, "samples": 2, "correct": 0, "rescued": False} for r in t)
    assert pol.calls == 3


def test_pick_best_tries_every_candidate(rows):
    labels = _labels(rows)

    def script(req):  # candidate 3 gets both re-rolls right, candidate 2 one of them
        text = "\n".join(m["content"] for m in req.messages)
        answer = next(a for p, a in labels.items() if p in text)
        j = int(req.id.split(":")[2])
        ok = HINTS[2] in text or (HINTS[1] in text and j == 0)
        return f"\\boxed{{{answer if ok else 123456789}}}"

    pol = FakeBackend(script=script)
    t = vouch_shard(rows, cfg(pick="best"), hinter(), policy=pol).to_pylist()
    assert [r["hint"] for r in t] == [HINTS[2]] * 3 and all(r["vouch"]["correct"] == 2 for r in t)
    assert pol.calls == 3


def test_rerolls_use_builds_layout_and_seeds_apart_from_rescue(rows):
    pol = policy("Read the question", _labels(rows))
    vouch_shard(rows, cfg(placement="after", samples=4), hinter(), policy=pol)
    reqs = pol.log[0]
    expected = prompt_messages([{"problem": r["problem"], "hint": HINTS[0], "domain": "math"} for r in rows], placement="after",
                               instructions=INSTRUCTIONS)
    assert [reqs[i * 4].messages for i in range(3)] == expected
    assert reqs[0].messages[-1]["content"].index("Hint:") > reqs[0].messages[-1]["content"].index(rows[0]["problem"][:30])
    assert (reqs[0].temperature, reqs[0].max_tokens) == (1.0, 1024)
    for i, r in enumerate(rows):
        seeds = {q.seed for q in reqs[i * 4:(i + 1) * 4]}
        assert len(seeds) == 4 and not seeds & {problem_seed(0, r["problem_id"], j) for j in range(64)}
    assert reroll_seed(cfg().vouch, "p", 0, 0) != reroll_seed(cfg().vouch, "p", 1, 0)


POLICY_MODULE = '''
LABELS = __LABELS__
def solves_with_remainder(req):
    text = "\\n".join(m["content"] for m in req.messages)
    answer = next(a for p, a in LABELS.items() if p in text)
    return "\\\\boxed{%s}" % (answer if "remainder" in text else "123456789")
'''


def test_hint_to_dir_with_vouching_records_the_rescue_and_its_cost(rows, gsm8k_collapsed, tmp_path, monkeypatch):
    labels = {r["problem"]: r["label"] for r in pq.read_table(gsm8k_collapsed).to_pylist()}
    (tmp_path / "vouch_policy.py").write_text(POLICY_MODULE.replace("__LABELS__", repr(labels)))
    monkeypatch.syspath_prepend(str(tmp_path))
    c = HintConfig(judge_check={"enabled": False},
                   vouch={"samples": 2, "candidates": 3,
                          "policy": {"backend": "fake", "options": {"script": "vouch_policy:solves_with_remainder"}}})

    class F:
        def __init__(self):
            self.fake = hinter()

        def __call__(self):
            return self.fake

        def describe(self):
            return {"kind": "fake", "script": "hinter"}

    st = HINT({"collapsed": [gsm8k_collapsed], "sample": 4}, c, tmp_path / "h", Context(backend=F()))
    hints = pl.read_parquet(tmp_path / "h" / "hints.parquet")
    assert check_schema(pq.read_schema(tmp_path / "h" / "hints.parquet"), "hints") == []
    assert hints["hint"].to_list() == [HINTS[1]] * 4  # "remainder" first appears in candidate 2
    assert hints["vouch"].struct.field("rescued").to_list() == [True] * 4
    stats = json.loads((tmp_path / "h" / "stats.json").read_text())
    assert stats["vouch"]["rescued"] == 4 and stats["vouch"]["candidates"] == 8 and stats["vouch"]["policy_requests"] == 16
    per = stats["vouch_per_rescued"]
    assert per["rescued"] == 4 and per["hint_tokens_per_rescued"] == round((st.prompt_tokens + st.completion_tokens) / 4, 1)
    assert per["policy_tokens_per_rescued"] > 0
    # build reads the vouched hints as any others
    from mentor.stages.build import BUILD, BuildConfig

    b = BUILD({}, BuildConfig(base="gsm8k", hints=[str(tmp_path / "h" / "hints.parquet")]), tmp_path / "p")
    assert b.hinted_rows == 4
    # a config without vouching keeps the hash of runs made before the setting existed
    assert "vouch" not in HintConfig().semantic() and "vouch" in c.semantic()


def test_vouch_config_errors():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="samples"):
        HintConfig(vouch={"samples": 0})
    with pytest.raises(ValidationError, match="pick"):
        HintConfig(vouch={"pick": "worst"})
