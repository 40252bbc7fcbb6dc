"""The rule registry: each hint rule is declared once, where its check is written, and looked up by name.

    @RuleRegistry.add("too_long", "the hint is too long: one to three short sentences", trimmable=True)
    def too_long(text: str, ctx: RuleContext) -> bool:
        ...

A check gets the stripped hint and the problem's `RuleContext` and says whether
the hint breaks the rule. Rules run in the order they are declared, which is
the order of a hint's violations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mentor.stages.rules.context import RuleContext

Check = Callable[[str, "RuleContext"], bool]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str  # stable: kept in the hint row's `violations` and counted in stats.json
    description: str  # what the repair agent is told about a hint that breaks it
    check: Check
    trimmable: bool = False  # dropping the hint's trailing sentences can cure it
    domain: str | None = None  # runs only on problems of this domain
    unless: str | None = None  # skipped when this rule (declared earlier) fired
    alone: bool = False  # when it fires it is the hint's only violation and no other rule runs


class RuleRegistry:
    """Every hint rule, in the order the rules run."""

    _rules: dict[str, Rule] = {}
    _ordered: tuple[Rule, ...] = ()
    _trimmable: frozenset[str] = frozenset()
    _by_domain: dict[str, tuple[Rule, ...]] = {}

    @classmethod
    def add(
        cls,
        name: str,
        description: str,
        *,
        trimmable: bool = False,
        domain: str | None = None,
        unless: str | None = None,
        alone: bool = False,
    ) -> Callable[[Check], Check]:
        """Declare a rule: a decorator for its check, which it returns unchanged."""

        def register(check: Check) -> Check:
            if name in cls._rules:
                raise ValueError(f"rule {name!r} is declared twice: rename one of them")
            if unless is not None and unless not in cls._rules:
                raise ValueError(f"rule {name!r}: unless={unless!r} names no rule declared before it")
            rule = Rule(name, description, check, trimmable, domain, unless, alone)
            cls._rules[name] = rule
            cls._ordered += (rule,)
            cls._by_domain.clear()
            if trimmable:
                cls._trimmable |= {name}
            return check

        return register

    @classmethod
    def get(cls, name: str) -> Rule:
        try:
            return cls._rules[name]
        except KeyError:
            raise KeyError(f"no rule named {name!r} (rules: {', '.join(cls._rules)})") from None

    @classmethod
    def rules(cls, domain: str | None = None) -> tuple[Rule, ...]:
        """Every rule, or those that run on problems of `domain`, in declaration order."""
        if domain is None:
            return cls._ordered
        hit = cls._by_domain.get(domain)
        if hit is None:
            hit = cls._by_domain[domain] = tuple(r for r in cls._ordered if r.domain in (None, domain))
        return hit

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(cls._rules)

    @classmethod
    def trimmable(cls) -> frozenset[str]:
        """The violations that dropping trailing sentences can cure."""
        return cls._trimmable


# Violations the hint stage sets itself (control flow), not the rules.
STAGE_VIOLATIONS = {
    "parse_error": "the output was not the requested JSON",
    "truncated": "the output was cut at the token limit",
    "judge_low_score": "the judge scored the hint below the threshold",
    "judge_parse_error": "the judge's output was not the requested JSON",
    "judge_incorrect": "the judge found a statement or calculation in the hint that is wrong",
}


def describe(violation: str) -> str:
    """What the repair agent is told about a violation (a rule's or the stage's; an unknown name as itself)."""
    rule = RuleRegistry._rules.get(violation)
    return rule.description if rule is not None else STAGE_VIOLATIONS.get(violation, violation)
