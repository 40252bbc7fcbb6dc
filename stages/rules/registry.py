"""The rule registry: each hint rule is declared once, where its check is written, and looked up by name.

    @RuleRegistry.add("too_long", "the hint is too long: one to three short sentences", trimmable=True)
    def too_long(text: str, ctx: RuleContext) -> bool:
        ...

A check gets the stripped hint and the problem's `RuleContext` and says whether
the hint breaks the rule. Rules run in the order of their ``order`` key (default
`DEFAULT_ORDER`; ``special_token`` runs last), rules of one order in the order they
are declared; that is the order of a hint's violations.

A verdict rule judges the LLM judge's verdict (its parsed fields) instead of the hint:

    @RuleRegistry.verdict("judge_low_score", "the judge scored the hint below the threshold")
    def low_score(verdict: dict, threshold: float) -> bool:
        ...

Discovery: every module of ``stages/rules/`` (and ``rules/<name>.py`` of each
``MENTOR_PLUGIN_PATH`` folder, `mentor.pipeline.plugins`) is imported the first time
the rules are asked for, so a module that declares rules is found from the folder: a
new rule is one new file. Modules without declarations (the context, the number
parser, ...) are the rules' infrastructure.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mentor.pipeline import plugins

if TYPE_CHECKING:
    from mentor.stages.rules.context import RuleContext

Check = Callable[[str, "RuleContext"], bool]
VerdictCheck = Callable[[dict, float], bool]
DEFAULT_ORDER = 50  # the built-in rules of `checks`; ``special_token`` has 100 (it runs last)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str  # stable: kept in the hint row's `violations` and counted in stats.json
    description: str  # what the repair agent is told about a hint that breaks it
    check: Check
    trimmable: bool = False  # dropping the hint's trailing sentences can cure it
    domain: str | None = None  # runs only on problems of this domain
    unless: str | None = None  # skipped when this rule (declared earlier) fired
    alone: bool = False  # when it fires it is the hint's only violation and no other rule runs
    order: int = DEFAULT_ORDER  # rules run by this key, then in declaration order


@dataclass(frozen=True, slots=True)
class VerdictRule:
    name: str  # the violation when it fires (the first that fires rejects the hint)
    description: str
    check: VerdictCheck  # (the judge's parsed verdict, the acceptance threshold) -> rejects
    order: int = DEFAULT_ORDER


class RuleRegistry:
    """Every hint rule, in the order the rules run."""

    _rules: dict[str, Rule] = {}
    _ordered: tuple[Rule, ...] = ()
    _trimmable: frozenset[str] = frozenset()
    _by_domain: dict[str, tuple[Rule, ...]] = {}
    _verdicts: dict[str, VerdictRule] = {}
    _stage: dict[str, str] = {}  # violations the hint stage's agents set (their repair messages)
    _found_for: str | None = None  # the MENTOR_PLUGIN_PATH the rules were discovered for
    _lock = threading.RLock()  # one discovery at a time (a server's hint chains check hints in threads)
    _discovering = False

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
        order: int = DEFAULT_ORDER,
    ) -> Callable[[Check], Check]:
        """Declare a rule: a decorator for its check, which it returns unchanged."""

        def register(check: Check) -> Check:
            if name in cls._rules or name in cls._verdicts:
                raise ValueError(f"rule {name!r} is declared twice: rename one of them")
            if unless is not None and unless not in cls._rules:
                raise ValueError(f"rule {name!r}: unless={unless!r} names no rule declared before it")
            rule = Rule(name, description, check, trimmable, domain, unless, alone, order)
            cls._rules[name] = rule
            cls._ordered = tuple(sorted((*cls._ordered, rule), key=lambda r: r.order))  # stable: declaration order
            cls._by_domain.clear()
            if trimmable:
                cls._trimmable |= {name}
            return check

        return register

    @classmethod
    def verdict(cls, name: str, description: str, *, order: int = DEFAULT_ORDER) -> Callable[[VerdictCheck], VerdictCheck]:
        """Declare a verdict rule: a decorator for its check of the judge's verdict."""

        def register(check: VerdictCheck) -> VerdictCheck:
            if name in cls._rules or name in cls._verdicts:
                raise ValueError(f"rule {name!r} is declared twice: rename one of them")
            cls._verdicts[name] = VerdictRule(name, description, check, order)
            cls._verdicts = dict(sorted(cls._verdicts.items(), key=lambda kv: kv[1].order))
            return check

        return register

    @classmethod
    def declare_violations(cls, violations: dict[str, str]) -> None:
        """Violations the hint stage sets itself (an agent's ``violations``), for `describe`."""
        cls._stage.update(violations)

    @classmethod
    def discover(cls) -> None:
        """Import every rule module (built-in and plugins) once per ``MENTOR_PLUGIN_PATH``.

        Rules once declared stay declared (a plugin folder dropped from the path later keeps its rules)."""
        key = os.environ.get(plugins.PLUGIN_PATH_ENV, "")
        if key == cls._found_for:
            return
        with cls._lock:
            if key == cls._found_for or cls._discovering:  # done by another thread, or asked while a rule module loads
                return
            cls._discovering = True
            try:
                for name in plugins.names("rules"):
                    plugins.load("rules", name)
                cls._found_for = key
            finally:
                cls._discovering = False

    @classmethod
    def get(cls, name: str) -> Rule:
        cls.discover()
        try:
            return cls._rules[name]
        except KeyError:
            raise KeyError(f"no rule named {name!r} (rules: {', '.join(cls._rules)})") from None

    @classmethod
    def rules(cls, domain: str | None = None) -> tuple[Rule, ...]:
        """Every rule, or those that run on problems of `domain`, in the order they run."""
        cls.discover()
        if domain is None:
            return cls._ordered
        hit = cls._by_domain.get(domain)
        if hit is None:
            hit = cls._by_domain[domain] = tuple(r for r in cls._ordered if r.domain in (None, domain))
        return hit

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(r.name for r in cls.rules())

    @classmethod
    def trimmable(cls) -> frozenset[str]:
        """The violations that dropping trailing sentences can cure."""
        cls.discover()
        return cls._trimmable

    @classmethod
    def verdicts(cls) -> tuple[VerdictRule, ...]:
        """The verdict rules, in the order they are tried."""
        cls.discover()
        return tuple(cls._verdicts.values())

    @classmethod
    def describe(cls, violation: str) -> str:
        """What the repair agent is told about a violation (a rule's or the stage's; an unknown name as itself)."""
        cls.discover()
        rule = cls._rules.get(violation) or cls._verdicts.get(violation)
        return rule.description if rule is not None else cls._stage.get(violation, violation)


def describe(violation: str) -> str:
    """What the repair agent is told about a violation (a rule's or the stage's; an unknown name as itself)."""
    return RuleRegistry.describe(violation)
