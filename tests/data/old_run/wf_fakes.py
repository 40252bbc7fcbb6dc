"""The fake policy and hint model of this fixture's workflow (as tests/test_workflow_run.py's, deterministic).

The policy answers right only when its prompt carries a hint; the hint model writes a per-problem, answer-free hint.
"""

import json
from pathlib import Path

import polars as pl

PROBLEMS = pl.read_parquet(Path(__file__).resolve().parent / "problems.parquet")
TEXTS = list(zip(PROBLEMS["problem_id"], PROBLEMS["problem"], PROBLEMS["label"]))
LETTERS = "abcdefghijklmnop"


def _find(text):
    for pid, problem, label in TEXTS:
        if problem in text:
            return pid, label
    raise AssertionError("unknown problem in prompt")


def policy(req):
    user = req.messages[-1]["content"]
    _, label = _find(user)
    if "Hint:" in user:
        return "Let me think step by step. The answer is \\boxed{" + label + "}."
    return "I think the answer is \\boxed{-1}."


def hinter(req):
    props = (req.json_schema or {}).get("properties", {})
    pid, _ = _find("\n".join(m["content"] for m in req.messages))
    tag = "".join(LETTERS[int(c, 16)] for c in pid.split("-")[-1][:6])
    if "keywords" in props:
        return json.dumps({"keywords": ["quantity asked", "units"], "error": "They answer a different quantity."})
    if "score" in props:
        return json.dumps({"score": 8, "feedback": "Specific and answer-free."})
    return json.dumps({"hint": "Hint " + tag + ": decide which quantity the question asks for before computing anything."})
