"""3. Judgment: problem, reference, hint -> {check, correct, score, feedback} (role review, after the rules pass).

Switch ``llm_judge``. What rejects a verdict is the verdict rules of ``stages/rules/``
(`RuleRegistry.verdict`: a wrong statement, a score below the threshold), each declared once there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mentor.stages.hint.agent import (Agent, Machine, State, Switch, clean_str, json_object, object_schema,
                                      reference_text, solution_in_view, strip_thinking, text_field)
from mentor.stages.rules import RuleLimits, RuleRegistry

if TYPE_CHECKING:
    from mentor.pipeline.llm import GenResult
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.prompt_templates import Templates

CHECK_CHARS = 400  # longest "check" of a judgment: the hint's numbers and claims, one by one


class Judgment(Agent):
    """3. problem, reference, hint -> {check, correct, score, feedback} (after the rules pass)."""

    name = "judgment"
    role = "review"
    switch = Switch("llm_judge", "Ask the LLM judge after the rules pass (off: the rules alone decide).")
    templates = {"judgment_system": frozenset(), "judgment_user": frozenset({"problem", "answer", "solution", "hint"})}
    max_tokens_default, max_tokens_help = 260, "max_tokens of a judgment call (check + verdict + feedback)."
    violations = {"judge_parse_error": "the judge's output was not the requested JSON"}
    counters = ("judge_calls",)
    fake = '{"score": 8, "feedback": "Specific and answer-free."}'

    def attempt(self, s: State) -> int:
        return s.cand_no - 1  # the candidate it judges

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        return self.chat(t, t.render("judgment_user", problem=row["problem"], answer=reference_text(row),
                                     solution=solution_in_view(row, cfg), hint=s.candidate or ""))

    def schema(self, cfg: HintConfig, limits: RuleLimits) -> dict:
        """``{"check", "score", "feedback"}``; with judge_correctness a ``"correct"`` verdict after the check.

        The check comes first: the judge goes through the hint's numbers and claims before its verdict. Asked
        for the verdict first, the 1.5B judged completeness ("the hint does not provide the total") and
        accepted 13 of 51 reference first steps on the dev problems; checking first, 47 of 51
        (docs/hint-pipeline.md, "Models")."""
        correct = {"correct": {"type": "boolean"}} if cfg.judge_correctness else {}
        return object_schema({"check": text_field(CHECK_CHARS)} | correct
                             | {"score": {"type": "integer", "minimum": 1, "maximum": 10}, "feedback": text_field(cfg.feedback_chars)})

    def parse(self, text: str, cfg: HintConfig) -> dict | None:
        """As `Agent.parse`; a verdict cut off inside its feedback (max_tokens reached) still gives its verdict:
        the grammar writes ``check``, ``correct`` and ``score`` first, so the string is closed and the feedback
        kept as far as it got. One cut off before its score gives none."""
        obj = json_object(text)
        if obj is None:
            cut = strip_thinking(text).rstrip()
            head = cut.split('"feedback"', 1)
            if len(head) == 2 and cut.lstrip().startswith("{") and head[1].lstrip().startswith(":"):
                obj = json_object(cut.rstrip("\\") + '"}')
        return None if obj is None else self.fields(obj, cfg)

    def fields(self, obj: dict, cfg: HintConfig) -> dict | None:
        """``{"score": float in [1, 10], "feedback": str}`` (+ ``"correct"`` when given) or None."""
        score = obj.get("score")
        if isinstance(score, str):
            try:
                score = float(score.strip())
            except ValueError:
                return None
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 1 <= score <= 10:
            return None
        out = {"score": float(score), "feedback": clean_str(obj.get("feedback"), cfg.feedback_chars) or ""}
        if isinstance(obj.get("correct"), bool):
            out["correct"] = obj["correct"]
        return out

    def consume(self, p: Any, res: GenResult, parsed: dict | None, m: Machine) -> None:
        """Approve, or reject with the first verdict rule that fires (`RuleRegistry.verdicts`: judge_incorrect, judge_low_score)."""
        m.st.judge_calls += 1
        if parsed is None:
            m.transition(p, "rejected", ["judge_parse_error"])
            return
        p.score = parsed["score"]
        for verdict in RuleRegistry.verdicts():
            if verdict.check(parsed, p.threshold):
                m.transition(p, "rejected", [verdict.name], parsed["feedback"])
                return
        m.transition(p, "approved")


AGENT = Judgment()
