"""4. Repair: problem, rejected hint, violations, feedback -> {hint} (the schema and parse of generation).

Role repair: a rejected candidate is repaired while ``max_refine`` allows; its hint goes through the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor.stages.hint.agent import State, reference_text, solution_in_view
from mentor.stages.hint.agents.generation import Generation
from mentor.stages.rules import describe

if TYPE_CHECKING:
    from mentor.stages.hint.config import HintConfig
    from mentor.stages.hint.prompt_templates import Templates


class Repair(Generation):
    """problem, rejected hint, violations, feedback -> {hint}."""

    name = "repair"
    role = "repair"
    switch = None
    templates = {"repair_system": frozenset(),
                 "repair_user": frozenset({"problem", "answer", "solution", "hint", "violations", "feedback"})}
    max_tokens_default, max_tokens_help = 360, "max_tokens of a repair call (reasoning + hint)."
    violations = {}

    def messages(self, s: State, cfg: HintConfig, t: Templates) -> list[dict]:
        row = s.row
        reasons = "\n".join(f"- {describe(v)}" for v in s.last_violations) or "- (none given)"
        return self.chat(t, t.render("repair_user", problem=row["problem"], answer=reference_text(row),
                                     solution=solution_in_view(row, cfg), hint=s.candidate or "",
                                     violations=reasons, feedback=s.feedback or "(none)"))


AGENT = Repair()
