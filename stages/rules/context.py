"""What the rules know about one problem (`RuleContext`, `RuleLimits`) and the text measures they share."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from fractions import Fraction

from mentor.stages.rules.numbers import AnswerMatcher, clean_latex, matcher_for, parse_numbers
from mentor.stages.rules.words import number_words


@dataclass(frozen=True)
class RuleLimits:
    """Bounds of an acceptable hint (the defaults of `mentor hint` and `mentor check-hint`).

    Three sentences: what the generation and repair prompts ask for ("one to three
    short sentences") and what the ``too_long`` message says.
    """

    max_chars: int = 400
    max_sentences: int = 3
    max_equations: int = 2
    max_steps: int = 2


WORD = re.compile(r"[a-z0-9]+")
SENT_END = re.compile(r"[.!?。！？](?=\s|$)")
_NON_WORD = re.compile(r"[\W_]+")


def normalise_hint(text: str) -> str:
    """Lowercase words only: the form used to spot repeats."""
    return _NON_WORD.sub(" ", text.lower()).strip()


def sentence_count(text: str) -> int:
    if text.count(".") + text.count("!") + text.count("?") <= 1 and text.isascii():
        return 1 if text.strip() else 0  # the common short case, without a regex
    n = len(SENT_END.findall(text.strip()))
    return n + (0 if text.rstrip().endswith((".", "!", "?", "。", "！", "？")) else 1) if text.strip() else 0


def latin_ratio(text: str) -> float:
    """Share of letters that are Latin (Greek counts as Latin: math uses π, θ, ...)."""
    latin = other = 0
    for ch in text:
        if ch.isalpha():
            if ch.isascii():
                latin += 1
            else:
                name = unicodedata.name(ch, "")
                if name.startswith(("LATIN", "GREEK", "MATHEMATICAL")):
                    latin += 1
                else:
                    other += 1
    total = latin + other
    return latin / total if total else 1.0


@dataclass
class RuleContext:
    """Everything the rules need about one problem, computed once per problem."""

    domain: str
    answer: str | None
    problem: str = ""
    previous_hints: tuple[str, ...] = ()
    limits: RuleLimits = field(default_factory=RuleLimits)
    entry_point: str | None = None
    # The chat-control tokens a hint must not carry (`special_tokens.control_tokens`); None: the built-in list.
    control_tokens: tuple[str, ...] | None = None
    matcher: AnswerMatcher = field(init=False)
    _problem_joined: str | None = field(default=None, init=False, repr=False)
    _problem_words: set | None = field(default=None, init=False, repr=False)
    _problem_trigrams: set | None = field(default=None, init=False, repr=False)
    _problem_numbers: set | None = field(default=None, init=False, repr=False)
    previous_normalised: frozenset = field(init=False, repr=False)  # the previous hints as `normalise_hint` writes them
    _latin_problem: bool | None = field(default=None, init=False, repr=False)
    _english_problem: bool | None = field(default=None, init=False, repr=False)
    entry_def: re.Pattern | None = field(init=False, repr=False)  # `def <entry point>(`, for code

    @classmethod
    def of_row(cls, row: dict, limits: RuleLimits, control_tokens: tuple[str, ...] | None = None) -> RuleContext:
        """The context of a collapsed row (domain, label, problem, previous hints): the hint stage's and its judge check's."""
        return cls(domain=row.get("domain") or "math", answer=row.get("label"), problem=row.get("problem") or "",
                   previous_hints=tuple(row.get("previous_hints") or ()), limits=limits, control_tokens=control_tokens)

    def __post_init__(self) -> None:
        if self.domain == "code":
            if self.entry_point is None and self.answer:
                self.entry_point = _entry_point(self.answer)
            self.matcher = matcher_for(None)
        else:
            self.matcher = matcher_for(self.answer)
        hints = self.previous_hints
        self.previous_normalised = frozenset(normalise_hint(h) for h in hints if h) if hints else frozenset()
        self.entry_def = re.compile(r"\bdef\s+" + re.escape(self.entry_point) + r"\s*\(") if self.entry_point else None

    @property
    def problem_joined(self) -> str:
        """The problem's words, lowercase, single-spaced (with spaces at both ends)."""
        if self._problem_joined is None:
            self._problem_joined = " " + " ".join(WORD.findall(self.problem.lower())) + " "
        return self._problem_joined

    @property
    def problem_numbers(self) -> set:
        """The distinct quantities the problem states (digits and small number words)."""
        if self._problem_numbers is None:
            self._problem_numbers = data_numbers(self.problem)
        return self._problem_numbers

    @property
    def problem_words(self) -> set:
        if self._problem_words is None:
            self._problem_words = set(WORD.findall(self.problem.lower()))
        return self._problem_words

    @property
    def problem_trigrams(self) -> set:
        if self._problem_trigrams is None:
            w = WORD.findall(self.problem.lower())
            self._problem_trigrams = set(zip(w, w[1:], w[2:]))
        return self._problem_trigrams

    @property
    def english_problem(self) -> bool:
        if self._english_problem is None:
            n, ratio = english_ratio(self.problem)
            self._english_problem = n >= 8 and ratio >= 0.15
        return self._english_problem

    @property
    def latin_problem(self) -> bool:
        if self._latin_problem is None:
            self._latin_problem = self.problem.isascii() or latin_ratio(self.problem) >= 0.9
        return self._latin_problem


def _entry_point(label: str) -> str | None:
    """The entry point from a code label (JSON) or the label itself when it is a bare name."""
    try:
        obj = json.loads(label)
    except (ValueError, TypeError):
        obj = None
    if isinstance(obj, dict):
        ep = obj.get("entry_point")
        return ep if isinstance(ep, str) and ep else None
    return label.strip() if re.fullmatch(r"[A-Za-z_]\w*", label.strip()) else None


# Common English function words: a Latin-script hint for an English problem that uses almost none
# of them is in another language (Portuguese, Spanish, ...) or is not prose at all.
_EN_STOP = frozenset(
    "a an the and or but of to in on at by for with from as is are was were be been it its this that these "
    "those you your how what which when where who many much each every first then than there their they "
    "he she his her we our if not do does did can could should would will use find think about into per "
    "all any more most one two after before".split()
)
_LETTER_WORD = re.compile(r"[^\W\d_]+")


def english_ratio(text: str) -> tuple[int, float]:
    words = _LETTER_WORD.findall(text.lower())
    if not words:
        return 0, 0.0
    return len(words), sum(1 for w in words if w in _EN_STOP) / len(words)


def data_numbers(text: str) -> set[Fraction]:
    """The quantities a text states: its numbers, and numbers written as words ("three", "forty-five").

    0, 1 and 2 are left out: they appear in any explanation ("the two values", "f(0)"), not only as data.
    """
    vals = {abs(n.value) for n in parse_numbers(clean_latex(text))}
    vals.update(abs(w.value) for w in number_words(text))
    return {v for v in vals if v > 2 or v.denominator != 1}
