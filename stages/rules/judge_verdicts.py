"""The verdict rules: what in the LLM judge's verdict rejects a hint that passed the rules.

Tried in order by the judgment agent (``stages/hint/agents/judgment.py``); the first that
fires is the hint's violation, with the judge's feedback for the repair agent.
"""

from __future__ import annotations

from mentor.stages.rules.registry import RuleRegistry


@RuleRegistry.verdict("judge_incorrect", "the judge found a statement or calculation in the hint that is wrong", order=10)
def judged_incorrect(verdict: dict, threshold: float) -> bool:
    """The judge's ``correct`` is false (judge_correctness on): rejected whatever the score."""
    return verdict.get("correct") is False


@RuleRegistry.verdict("judge_low_score", "the judge scored the hint below the threshold", order=20)
def low_score(verdict: dict, threshold: float) -> bool:
    return verdict["score"] < threshold
