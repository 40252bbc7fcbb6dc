"""Rule checks of a candidate hint: named violations, no model involved.

The judge runs these first; only a hint that passes every rule goes to the
LLM judge. Each violation has a stable name (kept in the hint row's
``violations`` and counted in stats.json):

- ``empty``                  nothing but whitespace / punctuation
- ``too_long``               more characters or sentences than allowed
- ``answer_leak``            the reference answer in any equivalent form
                             (``\\frac{14}{3}``, ``14/3``, ``4.666…``, ``4 2/3``,
                             ``4.67`` as a rounding, a boxed or "$...$" form, ...)
- ``final_answer_line``      "the answer is ...", ``\\boxed{}``, ``####``
- ``full_solution``          a worked solution (many equations or steps)
- ``restates_problem``       the hint mostly copies the problem text
- ``restates_numbers``       the hint lists the problem's data and nothing else: three or
                             more of its numbers (digits or number words; 0, 1 and 2 not
                             counted), at least 60% of them, no number of its own and no
                             operation or equation relating them (in symbols, or in words the
                             problem does not use itself: "subtract", "the difference", ...)
- ``list_header``            only a lead-in with nothing after it ("Here's the
                             step-by-step breakdown:", "Let's solve it:")
- ``starts_mid_sentence``    a lowercase first word ("cook the chicken. Since ..."):
                             the model's reasoning ran on into the hint field
- ``mentions_pipeline``      the reference answer or an earlier hint, which the solver never sees
- ``solution_code``          (code) a function defining the entry point
- ``repeats_previous_hint``  identical to a hint of an earlier round
- ``wrong_language``         mostly non-Latin script for a Latin-script problem
- ``answer_only``            (math) only an answer line or a bare value (``A: 66``, ``66``)

``answer_leak`` also covers arithmetic that evaluates to the answer and the
answer in number words (see "indirect leaks" at the end of this module).

How numbers are compared. Every number in the hint (integers, thousands
separators, decimals, repeating decimals written ``4.666…``/``4.(6)``,
fractions ``14/3``, mixed numbers ``4 2/3``, ``\\frac{14}{3}``, percents) is
turned into an exact rational and compared with a numeric reference answer;
a decimal with d digits also leaks when it is the answer rounded to d digits.
Everything else (LaTeX segments, boxed content, expressions, non-numeric
answers such as ``p - q`` or ``(3, \\frac{\\pi}{2})``) is compared with
math-verify. Other numbers of the problem (``3 apples``) pass, unless they
equal the answer.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

RULE_VIOLATIONS = (
    "empty",
    "too_long",
    "answer_leak",
    "final_answer_line",
    "full_solution",
    "restates_problem",
    "restates_numbers",
    "list_header",
    "starts_mid_sentence",
    "mentions_pipeline",
    "solution_code",
    "repeats_previous_hint",
    "wrong_language",
    "answer_only",
)

DESCRIPTIONS = {
    "empty": "the hint is empty",
    "too_long": "the hint is too long: one to three short sentences",
    "answer_leak": "the hint reveals the final answer (in some form); remove every trace of it",
    "final_answer_line": "the hint states a final answer ('the answer is', boxed); point a direction instead",
    "full_solution": "the hint works out the solution step by step; give only the key idea",
    "restates_problem": "the hint only restates the problem; name the idea the solver is missing",
    "restates_numbers": "the hint repeats the problem's numbers; name the relation or first step instead of the data",
    "mentions_pipeline": "the hint talks about the reference answer or an earlier hint, which the solver never sees; address the problem itself",
    "list_header": "the hint is only a lead-in ('Here is the breakdown:'); write the hint itself",
    "starts_mid_sentence": "the hint starts mid-sentence; write it as whole sentences that begin with a capital letter",
    "solution_code": "the hint contains the solution code; describe the approach in words",
    "repeats_previous_hint": "the hint repeats an earlier hint; go one step further",
    "wrong_language": "the hint is not in the language of the problem",
    "answer_only": "the hint is only an answer (a bare value or 'A: ...'); give a direction in words instead",
    # control-flow violations (set by the hint stage, not by these rules)
    "parse_error": "the output was not the requested JSON",
    "truncated": "the output was cut at the token limit",
    "judge_low_score": "the judge scored the hint below the threshold",
    "judge_parse_error": "the judge's output was not the requested JSON",
    "judge_incorrect": "the judge found a statement or calculation in the hint that is wrong",
}


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


# --------------------------------------------------------------------------- text helpers

_WORD = re.compile(r"[a-z0-9]+")
_SENT_END = re.compile(r"[.!?。！？](?=\s|$)")
_NON_WORD = re.compile(r"[\W_]+")


def normalise_hint(text: str) -> str:
    """Lowercase words only: the form used to spot repeats."""
    return _NON_WORD.sub(" ", text.lower()).strip()


def sentence_count(text: str) -> int:
    if text.count(".") + text.count("!") + text.count("?") <= 1 and text.isascii():
        return 1 if text.strip() else 0  # the common short case, without a regex
    n = len(_SENT_END.findall(text.strip()))
    return n + (0 if text.rstrip().endswith((".", "!", "?", "。", "！", "？")) else 1) if text.strip() else 0


def _latin_ratio(text: str) -> float:
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


# --------------------------------------------------------------------------- numbers

_DASHES = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " "})
_LATEX_SPACES = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_MIXED_LATEX = re.compile(r"(?<![\d.])(\d+)\s*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_MIXED = re.compile(r"(?<![\d./])(\d+)\s+(\d+)\s*/\s*(\d+)(?!\d|\.\d|/)")
_RATIO = re.compile(r"(?<![\d./])(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?![\d/])")
# a number: thousands separators, decimals, a repeating tail (4.666…, 4.666..., 4.\overline{6}, 4.(6)), percent
_NUMBER = re.compile(
    r"(?<![\w.])(-?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d*))?"
    r"(\s*(?:\.\.\.|…|\\ldots|\\dots|\\cdots)|\\overline\{(\d+)\}|\((\d+)\))?"
    r"(\s*(?:\\?%|percent))?"
)
_HAS_DIGIT = re.compile(r"\d")
_MAX_DIGITS = 1000  # longer digit runs are not numbers to compare (int() refuses past 4300 digits)
_LONG_DIGITS = re.compile(r"\d{%d,}" % (_MAX_DIGITS + 1))


@dataclass(frozen=True, slots=True)
class Num:
    value: Fraction
    approx_digits: int | None  # None: exact; d: a decimal with d digits (a rounding may leak)


def _parse_numbers(text: str) -> list[Num]:
    """Every number in `text` as an exact rational (fractions and mixed numbers resolved)."""
    out: list[Num] = []
    if not _HAS_DIGIT.search(text):
        return out
    if len(text) > _MAX_DIGITS:
        text = _LONG_DIGITS.sub(" ", text)  # not numbers to compare, and int() refuses them
    # Digits inside a fraction or mixed number belong to that value, not to separate numbers
    # (the 3 of "1/3" is not the answer 3).
    taken: list[tuple[int, int]] = []

    def free(m: re.Match) -> bool:
        a, b = m.span()
        return not any(s < b and a < e for s, e in taken)

    for m in _MIXED_LATEX.finditer(text):
        w, a, b = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if b:
            out.append(Num(w + Fraction(a, b), None))
            taken.append(m.span())
    for m in _FRAC.finditer(text):
        a, b = Fraction(m.group(1)), Fraction(m.group(2))
        if b and free(m):
            out.append(Num(a / b, None))
            taken.append(m.span())
    for m in _FRAC_SHORT.finditer(text):
        b = int(m.group(2))
        if b and free(m):
            out.append(Num(Fraction(int(m.group(1)), b), None))
            taken.append(m.span())
    for m in _MIXED.finditer(text):
        w, a, b = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if b and a < b and free(m):
            out.append(Num(w + Fraction(a, b), None))
            taken.append(m.span())
    for m in _RATIO.finditer(text):
        a, b = Fraction(m.group(1)), Fraction(m.group(2))
        if b and free(m):
            out.append(Num(a / b, None))
            taken.append(m.span())
    for m in _NUMBER.finditer(text):
        if taken and not free(m):
            continue
        sign, whole, dec, rep, over, paren, pct = m.groups()
        whole = whole.replace(",", "")
        if (over or paren) and dec is not None:  # 4.\overline{6} / 4.(6): exact repeating decimal
            period = over or paren
            head = dec
            base = Fraction(int(whole + head), 10 ** len(head))
            value = base + Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(head))
            approx = None
        elif dec:
            value = Fraction(int(whole + dec), 10 ** len(dec))
            approx = len(dec)
            if rep:  # 4.666… : a rounding-free truncation; allow one more unit of slack
                approx = max(len(dec) - 1, 0) if len(dec) > 1 else len(dec)
        else:
            value = Fraction(int(whole))
            approx = None
        if sign:
            value = -value
        if pct:
            out.append(Num(value / 100, None if approx is None else approx + 2))
        out.append(Num(value, approx))
    return out


def _plain_number(text: str) -> Fraction | None:
    """The answer as an exact rational when it is one number (``18``, ``1,000``, ``\\frac{14}{3}``, ``-2.5``, ``90^\\circ``)."""
    t = _clean_latex(text)
    t = re.sub(r"\^\s*\{?\\circ\}?|\\%|%|\\\$|\$", "", t).strip()
    t = re.sub(r"^\\text\{\s*\}|\\(?:text|mathrm)\{[^}]*\}$", "", t).strip()
    m = re.fullmatch(r"(-?)\s*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}", t)
    if m:
        v = Fraction(int(m.group(2)), int(m.group(3))) if int(m.group(3)) else None
        return -v if (v is not None and m.group(1)) else v
    m = re.fullmatch(r"(-?)(\d+)\s*/\s*(\d+)", t)
    if m and int(m.group(3)):
        v = Fraction(int(m.group(2)), int(m.group(3)))
        return -v if m.group(1) else v
    m = re.fullmatch(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?", t)
    if m and len(t) <= _MAX_DIGITS:
        return Fraction(t.replace(",", ""))
    return None


def _clean_latex(text: str) -> str:
    text = text.translate(_DASHES)
    text = _LATEX_SPACES.sub(" ", text)
    return text.replace("\\left", "").replace("\\right", "").replace("\\!", "").strip()


_SQUASH = re.compile(r"\s+|\\text\{|\\mathrm\{|\\mbox\{|[{}$]")


_SIMPLE_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_SQRT = re.compile(r"\\sqrt\{([^{}]+)\}")
_CMD = re.compile(r"\\(pi|theta|alpha|beta|infty|cdot|times)\b")


def _squash(text: str) -> str:
    """A plain-text form for substring tests of non-numeric answers: spaces and LaTeX wrappers
    removed, ``\\frac{a}{b}`` -> ``a/b``, ``\\sqrt{x}`` -> ``sqrt(x)``, ``\\pi`` -> ``pi``, lowercase."""
    t = _clean_latex(text)
    t = _SIMPLE_FRAC.sub(r"\1/\2", t)
    t = _SQRT.sub(r"sqrt(\1)", t)
    t = _CMD.sub(r"\1", t)
    return _SQUASH.sub("", t).lower()


# --------------------------------------------------------------------------- math-verify

_MATH_SEGMENT = re.compile(
    r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}"
    r"|\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]",
    re.S,
)


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set (dask runs tasks in threads).
    return 5 if threading.current_thread() is threading.main_thread() else None


_MV_CACHE: dict[str, list] = {}


def _mv_parse(latex: str) -> list | None:
    """math-verify's parse of one expression; [] when unparseable, None when it timed out (unknown)."""
    hit = _MV_CACHE.get(latex)
    if hit is not None:
        return hit
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        out = parse(f"${latex}$", parsing_timeout=_timeout(), raise_on_error=True)
    except TimeoutException:
        return None  # not cached: a loaded machine must not turn into a permanent "no match"
    except Exception:  # math-verify raises on pathological input: no expression there
        out = []
    if len(_MV_CACHE) < 8192:
        _MV_CACHE[latex] = out
    return out


def _mv_equal(gold: list | None, latex: str) -> bool:
    """Whether `latex` equals the answer; a timeout counts as equal (the leak guard errs on the safe side)."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    target = _mv_parse(latex)
    if gold is None or target is None:
        return True
    if not gold or not target:
        return False
    try:
        return bool(verify(gold, target, timeout_seconds=_timeout(), raise_on_error=True))
    except TimeoutException:
        return True
    except Exception:
        return False


# --------------------------------------------------------------------------- answer matcher


class AnswerMatcher:
    """Does a text contain the reference answer in any equivalent form?"""

    def __init__(self, answer: str | None) -> None:
        self.answer = (answer or "").strip()
        self.value = _plain_number(self.answer) if self.answer else None
        # A list of numbers ("1,-2", "3, 5, 7"): leaks when every one of them appears.
        self.values: list[Fraction] = []
        if self.value is None and "," in self.answer:
            parts = [_plain_number(p) for p in _clean_latex(self.answer).strip("()[]{} ").split(",")]
            if len(parts) >= 2 and all(p is not None for p in parts):
                self.values = [abs(p) for p in parts]  # type: ignore[arg-type]
        self.squashed = _squash(self.answer) if self.answer else ""
        self._gold = None
        # A word answer ("Evelyn", "\text{(C)}") is matched as a whole word.
        inner = re.sub(r"\\text\{([^}]*)\}", r"\1", self.answer).strip()
        self.word = None
        if inner and self.value is None and re.fullmatch(r"[A-Za-z][A-Za-z .'-]*", inner):
            self.word = re.compile(r"(?<![A-Za-z])" + re.escape(inner.lower()) + r"(?![A-Za-z])")

    @property
    def gold(self) -> list | None:
        """The parsed answer ([] when math-verify cannot read it, None after a timeout: retried next time)."""
        if self._gold is None:
            self._gold = _mv_parse(_clean_latex(self.answer)) if self.answer else []
        return self._gold

    def _number_leaks(self, nums: list[Num]) -> bool:
        target = abs(self.value)
        for n in nums:
            v = abs(n.value)
            if v == target:
                return True
            if n.approx_digits is not None and n.approx_digits >= 1:
                # 4.67 / 4.666… are the answer rounded (or cut) to that many digits.
                if abs(v - target) < Fraction(1, 2 * 10 ** n.approx_digits) + Fraction(1, 10 ** (n.approx_digits + 6)):
                    return True
        return False

    def leaks(self, text: str) -> bool:
        if not self.answer or not text:
            return False
        if self.value is not None and not _HAS_DIGIT.search(text):
            return False  # a rational answer needs a digit (number words are not read; see module doc)
        clean = _clean_latex(text)
        if self.value is not None:
            if self._number_leaks(_parse_numbers(clean)):
                return True
            if "\\" not in clean and "^" not in clean:
                return False  # plain text: every number was compared exactly above
        else:
            if self.values:
                found = {abs(n.value) for n in _parse_numbers(clean)}
                if all(v in found for v in self.values):
                    return True
            if self.word is not None and self.word.search(clean.lower()):
                return True
            if len(self.squashed) >= 2 and self.squashed in _squash(clean):
                return True
            if len(self.squashed) == 1 and re.search(r"(?<![\w\\])" + re.escape(self.squashed) + r"(?!\w)", clean.lower()):
                return True
        # Expressions: every math segment (and, for symbolic answers, every `= rhs`) through math-verify.
        segments = [next(g for g in m.groups() if g is not None) for m in _MATH_SEGMENT.finditer(clean)]
        if self.value is None and not segments:
            segments = [s.strip(" .,;") for s in re.split(r"=|\bis\b|:", clean)[1:]]
        for seg in segments:
            seg = seg.strip()
            if not seg:
                continue
            if self.value is not None:
                if self._number_leaks(_parse_numbers(seg)):
                    return True
                if not re.search(r"\\|\^|[a-zA-Z]", seg):
                    continue  # only plain numbers: compared above
            gold = self.gold
            if (gold is None or gold) and _mv_equal(gold, seg):
                return True
        return False


@lru_cache(maxsize=65536)
def matcher_for(answer: str | None) -> AnswerMatcher:
    """One matcher per distinct answer (answers repeat a lot: GSM8K's are small integers)."""
    return AnswerMatcher(answer)


# --------------------------------------------------------------------------- rules

_FINAL = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?(?:answer|result|solution)\s*(?:is|=|:|would\s+be|should\s+be|will\s+be|equals)\b"
    r"|\\boxed|####|\bfinal\s+answer\b",
    re.I,
)
_STEP = re.compile(r"(?im)\bstep\s*\d+|^\s*\d+[.)]\s")
_EQUALS = re.compile(r"(?<![<>!=])=(?!=)")
_CODE_FENCE = re.compile(r"```")
_ALNUM = re.compile(r"[^\W_]")


@dataclass
class RuleContext:
    """Everything the rules need about one problem, computed once per problem."""

    domain: str
    answer: str | None
    problem: str = ""
    previous_hints: tuple[str, ...] = ()
    limits: RuleLimits = field(default_factory=RuleLimits)
    entry_point: str | None = None
    matcher: AnswerMatcher = field(init=False)
    _problem_joined: str | None = field(default=None, init=False, repr=False)
    _problem_words: set | None = field(default=None, init=False, repr=False)
    _problem_trigrams: set | None = field(default=None, init=False, repr=False)
    _problem_numbers: set | None = field(default=None, init=False, repr=False)
    _previous: frozenset = field(init=False, repr=False)
    _latin_problem: bool | None = field(default=None, init=False, repr=False)
    _english_problem: bool | None = field(default=None, init=False, repr=False)
    _def_re: re.Pattern | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.domain == "code":
            if self.entry_point is None and self.answer:
                self.entry_point = _entry_point(self.answer)
            self.matcher = matcher_for(None)
        else:
            self.matcher = matcher_for(self.answer)
        self._previous = frozenset(normalise_hint(h) for h in self.previous_hints if h) if self.previous_hints else frozenset()
        self._def_re = re.compile(r"\bdef\s+" + re.escape(self.entry_point) + r"\s*\(") if self.entry_point else None

    @property
    def problem_joined(self) -> str:
        """The problem's words, lowercase, single-spaced (with spaces at both ends)."""
        if self._problem_joined is None:
            self._problem_joined = " " + " ".join(_WORD.findall(self.problem.lower())) + " "
        return self._problem_joined

    @property
    def problem_numbers(self) -> set:
        """The distinct quantities the problem states (digits and small number words)."""
        if self._problem_numbers is None:
            self._problem_numbers = _data_numbers(self.problem)
        return self._problem_numbers

    @property
    def problem_words(self) -> set:
        if self._problem_words is None:
            self._problem_words = set(_WORD.findall(self.problem.lower()))
        return self._problem_words

    @property
    def problem_trigrams(self) -> set:
        if self._problem_trigrams is None:
            w = _WORD.findall(self.problem.lower())
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
            self._latin_problem = self.problem.isascii() or _latin_ratio(self.problem) >= 0.9
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


def _not_english(hint: str) -> bool:
    n, ratio = english_ratio(hint)
    return n >= 10 and ratio < 0.1


def _restates(hint: str, ctx: RuleContext) -> bool:
    if not ctx.problem:
        return False
    words = _WORD.findall(hint.lower())
    if len(words) < 6:
        return False
    # Cheap probe first: a hint that copies the problem shares word triples with it at its start,
    # middle or end; a hint with none of those three in the problem is not a restatement.
    joined = ctx.problem_joined
    n = len(words)
    if not any(" ".join(words[i : i + 3]) in joined for i in (0, n // 2 - 1, n - 3)):
        return False
    pw = ctx.problem_words
    if sum(1 for w in words if w in pw) < 0.8 * len(words):
        return False
    grams = list(zip(words, words[1:], words[2:]))
    pt = ctx.problem_trigrams
    return sum(1 for g in grams if g in pt) >= 0.8 * len(grams)


def _data_numbers(text: str) -> set[Fraction]:
    """The quantities a text states: its numbers, and numbers written as words ("three", "forty-five").

    0, 1 and 2 are left out: they appear in any explanation ("the two values", "f(0)"), not only as data.
    """
    vals = {abs(n.value) for n in _parse_numbers(_clean_latex(text))}
    vals.update(abs(w.value) for w in number_words(text))
    return {v for v in vals if v > 2 or v.denominator != 1}


def _restates_numbers(hint: str, ctx: RuleContext) -> bool:
    if not ctx.problem or not _HAS_DIGIT.search(hint):
        return False
    given = ctx.problem_numbers
    if len(given) < 3:
        return False
    mine = _data_numbers(hint)
    shared = len(given & mine)
    # A hint that derives a quantity of its own ("16 - 3 - 4 = 9 eggs are sold") or relates the data in an
    # operation or equation ("X - X*25% = $19.50") works with the data; one that only lists it restates it.
    return (shared >= 3 and shared >= 0.6 * len(given) and mine <= given and not _OPERATION.search(hint)
            and not _operation_in_words(hint, ctx))


_OPERATION = re.compile(r"=|\d\s*%?\s*[-+*/×÷x]\s*\$?\d|\\(?:times|cdot|div|frac)")
# An operation said in words ("Subtract the 3 eaten and the 4 baked from the 16 laid") relates the numbers as
# much as "16 - 3 - 4" does.
_OPERATION_WORDS = re.compile(
    r"\b(?:subtract\w*|minus|plus|add(?:s|ed|ing)?|multipl\w*|divid\w*|sum|difference|product|quotient|"
    r"ratio|twice|triple|double|halve|take\w*\s+away|deduct\w*|combine\w*)\b",
    re.I,
)


def _operation_in_words(hint: str, ctx: RuleContext) -> bool:
    """An operation word in the hint that the problem does not use itself (copied from the problem, it restates)."""
    return any(m.group(0).split()[0].lower() not in ctx.problem_words for m in _OPERATION_WORDS.finditer(hint))


_LEAD_IN = re.compile(
    r"^(?:here(?:'s| is| are)|let(?:'s| us| me)|below is|the following|follow these|to solve (?:this|it)|"
    r"i will|we will|we can)\b[^.!?]{0,80}$",
    re.I,
)


def _list_header(text: str) -> bool:
    """A lead-in that promises content and stops: ends with a colon, or a bare 'Here's ...' / 'Let's ...' phrase."""
    t = text.strip().rstrip("*_ ")
    if t.endswith((":", "：")):
        return True
    words = t.split()
    return len(words) <= 10 and bool(_LEAD_IN.match(t.rstrip(".!")))


# A first word in lowercase letters, followed by a space or punctuation (not "x", "gcd(", "don't", "x-axis").
_LOWER_FIRST = re.compile(r"([a-z]{2,})(?=[\s,;:!?]|\.(?:\s|$)|$)")


def _starts_mid_sentence(text: str, ctx: RuleContext) -> bool:
    """A hint that opens in the middle of a sentence: the 1.5B hinter sometimes stops its JSON "reasoning"
    mid-sentence and goes on in "hint" ("...the time it takes to" / "cook the chicken. Since ...").
    In code a lowercase first word that the problem uses is an identifier ("nums may be empty")."""
    m = _LOWER_FIRST.match(text)
    if m is None:
        return False
    return not (ctx.domain == "code" and re.search(r"\b" + m.group(1) + r"\b", ctx.problem))


# The agents see the reference answer and rejected hints; the solver sees neither.
_PIPELINE = re.compile(r"\b(reference (answer|solution)|(rejected|previous|earlier|original) hint)\b", re.I)


def check_hint(hint: str, ctx: RuleContext) -> list[str]:
    """The names of every rule `hint` violates (empty list: it passes)."""
    text = hint.strip() if hint else ""
    if not _ALNUM.search(text):
        return ["empty"]
    out: list[str] = []
    lim = ctx.limits
    if len(text) > lim.max_chars or sentence_count(text) > lim.max_sentences:
        out.append("too_long")
    if ctx.matcher.leaks(text) or indirect_leak(text, ctx.matcher):
        out.append("answer_leak")
    if ctx.domain == "math" and answer_only(text):
        out.append("answer_only")
    low = text.lower()
    # Cheap substring tests gate the regexes: most hints contain none of these.
    if ("answer" in low or "result" in low or "solution" in low or "boxed" in low or "####" in text) and _FINAL.search(text):
        out.append("final_answer_line")
    if (text.count("=") > lim.max_equations and len(_EQUALS.findall(text)) > lim.max_equations) or (
        ("step" in low or "\n" in text) and len(_STEP.findall(text)) > lim.max_steps
    ):
        out.append("full_solution")
    if _restates(text, ctx):
        out.append("restates_problem")
    elif _restates_numbers(text, ctx):
        out.append("restates_numbers")
    if _list_header(text):
        out.append("list_header")
    if "a" <= text[0] <= "z" and _starts_mid_sentence(text, ctx):
        out.append("starts_mid_sentence")
    if ("reference" in low or "hint" in low) and _PIPELINE.search(text):
        out.append("mentions_pipeline")
    if ctx.domain == "code" and (
        (ctx._def_re is not None and ctx._def_re.search(text))
        or (_CODE_FENCE.search(text) and re.search(r"\bdef\s+\w+\s*\(|\breturn\b", text))
    ):
        out.append("solution_code")
    if ctx._previous and normalise_hint(text) in ctx._previous:
        out.append("repeats_previous_hint")
    # The hint's own tests first: the problem's script/language is computed only when they fire.
    if (not text.isascii() and _latin_ratio(text) < 0.7 and ctx.latin_problem) or (
        _not_english(text) and ctx.english_problem and ctx.latin_problem
    ):
        out.append("wrong_language")
    return out


# A rambling model writes a good first sentence and then the whole solution: the rules reject the
# hint for what comes after. These are the violations that dropping trailing sentences can cure.
TRIMMABLE = frozenset({"too_long", "answer_leak", "final_answer_line", "full_solution", "answer_only", "restates_numbers",
                       "mentions_pipeline"})
MIN_TRIMMED_WORDS = 8


def trim_to_rules(hint: str, ctx: RuleContext, violations: Sequence[str]) -> str | None:
    """The longest run of `hint`'s leading whole sentences that passes every rule, or None.

    Only for hints rejected for trimmable reasons alone (a restated problem or solution code is not cured
    by cutting), and only when the kept part has at least MIN_TRIMMED_WORDS words.
    """
    if not violations or not set(violations) <= TRIMMABLE:
        return None
    text = hint.strip()
    ends = [m.end() for m in _SENT_END.finditer(text)]
    for end in reversed(ends):
        head = text[:end].strip()
        if head == text or len(_WORD.findall(head.lower())) < MIN_TRIMMED_WORDS:
            continue
        if not check_hint(head, ctx):
            return head
    return None


@dataclass
class RuleReport:
    ok: bool
    violations: list[str]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "violations": self.violations}


def check(
    hint: str,
    domain: str = "math",
    answer: str | None = None,
    problem: str = "",
    previous_hints: tuple[str, ...] | list[str] = (),
    entry_point: str | None = None,
    limits: RuleLimits | None = None,
) -> RuleReport:
    """Run the rules on one hint (the `mentor check-hint` entry point)."""
    ctx = RuleContext(
        domain=domain,
        answer=answer,
        problem=problem or "",
        previous_hints=tuple(previous_hints),
        limits=limits or RuleLimits(),
        entry_point=entry_point,
    )
    v = check_hint(hint, ctx)
    return RuleReport(ok=not v, violations=v)


@dataclass(frozen=True)
class Instructions:
    """An agent's own instructions (its templates, placeholders removed), to spot output that parrots them."""

    joined: str  # words, single-spaced, with spaces at both ends
    grams: frozenset

    @classmethod
    def of(cls, *texts: str) -> Instructions:
        w = _WORD.findall(_PLACEHOLDER_RE.sub(" ", " ".join(texts).lower()))
        return cls(" " + " ".join(w) + " ", frozenset(zip(w, w[1:], w[2:])))


_PLACEHOLDER_RE = re.compile(r"\{\{\s*\w+\s*\}\}")


def copies_instructions(text: str, instructions: Instructions, problem: str = "") -> bool:
    """Whether `text` (an attributed error or keyword) repeats the instructions rather than analysing the attempts.

    Half or more of its word triples come from the instructions and not from
    the problem; a text of one or two words when it is a phrase of the
    instructions that the problem does not use ("failed attempts").
    """
    w = _WORD.findall(text.lower())
    if not w:
        return False
    pw = _WORD.findall(problem.lower())
    if len(w) < 3:
        phrase = " " + " ".join(w) + " "
        return phrase in instructions.joined and phrase not in " " + " ".join(pw) + " "
    pgrams = set(zip(pw, pw[1:], pw[2:]))
    mine = list(zip(w, w[1:], w[2:]))
    return sum(1 for g in mine if g in instructions.grams and g not in pgrams) >= 0.5 * len(mine)


def text_leaks_answer(text: str, ctx: RuleContext) -> bool:
    """For keywords and attributed errors: does `text` carry the answer?"""
    return ctx.matcher.leaks(text) or indirect_leak(text, ctx.matcher)


# --------------------------------------------------------------------------- indirect leaks
#
# Three more ways a hint gives the answer away, each a named check of its own:
#
# - `expression_leak`: arithmetic that evaluates to the answer (``3^3`` for 27, ``2*9``,
#   ``\sqrt{81}``, ``nine times two``), evaluated exactly on rationals within fixed bounds
#   (exponents, sizes, tokens), so a hostile hint cannot make the guard slow;
# - `number_word_leak`: the answer in words (``eighteen``, ``one hundred and five``,
#   ``three quarters``, ``18 thousand``). Single words for 0, 1 and 2 ("one of them",
#   "the two cases") are too common in honest hints to count;
# - `answer_only`: a hint that is only an answer line or a bare value (``A: 66``, ``66``,
#   ``$\frac{1}{2}$``), whatever the value: a wrong final answer is no hint either.

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_FRACTION_WORDS = {
    "half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4, "fourths": 4,
    "fifth": 5, "fifths": 5, "sixth": 6, "sixths": 6, "seventh": 7, "sevenths": 7, "eighth": 8, "eighths": 8,
    "ninth": 9, "ninths": 9, "tenth": 10, "tenths": 10, "twelfth": 12, "twelfths": 12,
}
_WORD_TOKEN = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?")
_NUMBER_VOCAB = set(_UNITS) | set(_TENS) | set(_SCALES) | set(_FRACTION_WORDS) | {"hundred", "dozen", "and", "a", "an", "percent"}
_NUMBER_WORD_GATE = frozenset(set(_UNITS) | set(_TENS) | set(_SCALES) | set(_FRACTION_WORDS) | {"hundred", "dozen"})
_LETTERS = re.compile(r"[a-z]+")


@dataclass(frozen=True, slots=True)
class _WordNumber:
    start: int
    end: int
    value: Fraction  # "fifteen percent": 15, with percent=True (it leaks 15 and 0.15, like "15%")
    words: int  # how many number words make it up (a lone "one" is 1)
    percent: bool = False


def number_words(text: str) -> list[_WordNumber]:
    """Every number written in English words in `text`, with its exact value and span."""
    if _NUMBER_WORD_GATE.isdisjoint(_LETTERS.findall(text.lower())):
        return []
    toks = [(m.group(0).lower(), m.start(), m.end()) for m in _WORD_TOKEN.finditer(text)]
    out: list[_WordNumber] = []
    i = 0
    while i < len(toks):
        w = toks[i][0]
        found = _parse_number_words(toks, i) if w in _NUMBER_VOCAB or w[0].isdigit() else None
        if found is None:
            i += 1
            continue
        j, value, words = found
        pct = toks[j - 1][0] == "percent"
        out.append(_WordNumber(toks[i][1], toks[j - 1][2], value, words - pct, pct))
        i = j
    return out


# Number words that alone never count as the answer (see number_word_leak); a text whose only
# number words are these cannot spell the answer, and is not parsed at all.
_SMALL_WORDS = frozenset({"zero", "one", "two"})


def _cardinal(toks: list[tuple[str, int, int]], i: int) -> tuple[int, Fraction, int] | None:
    """A cardinal from token i: (next token, value, number words used), or None."""
    total, current, words, last = 0, Fraction(0), 0, None
    j = i
    while j < len(toks):
        w = toks[j][0]
        nxt = toks[j + 1][0] if j + 1 < len(toks) else ""
        if w in _UNITS and last in (None, "tens", "hundred", "scale", "and"):
            if last == "tens" and _UNITS[w] >= 10:
                break
            current += _UNITS[w]
            last = "unit"
        elif w in _TENS and last in (None, "hundred", "scale", "and"):
            current += _TENS[w]
            last = "tens"
        elif w[0].isdigit() and last is None and nxt in (*_SCALES, "hundred"):
            current = Fraction(w)
            last = "digits"
        elif w in ("a", "an") and last is None and nxt in ("hundred", "dozen", *_SCALES):
            current = Fraction(1)
            last = "unit"
        elif w == "hundred" and last in ("unit", "digits") and current < 100:
            current *= 100
            last = "hundred"
        elif w == "dozen" and last in ("unit", "digits", "tens"):
            current *= 12
            last = "scale"
        elif w in _SCALES and last in ("unit", "tens", "hundred", "digits"):
            total += current * _SCALES[w]
            current = Fraction(0)
            last = "scale"
        elif w == "and" and last in ("hundred", "scale") and (nxt in _UNITS or nxt in _TENS):
            last = "and"
        else:
            break
        if w not in ("and",):
            words += 1
        j += 1
    if j == i or last in ("and", None) or (last == "digits"):
        return None
    return j, total + current, words


def _parse_number_words(toks: list[tuple[str, int, int]], i: int) -> tuple[int, Fraction, int] | None:
    """A number phrase from token i: a cardinal, a fraction ("three quarters", "a half"), or both
    ("one and a half"), optionally followed by "percent"."""
    w = toks[i][0]
    if w not in _NUMBER_VOCAB and not w[0].isdigit():
        return None
    card = _cardinal(toks, i)
    j, value, words = card if card is not None else (i, Fraction(0), 0)
    # "<count> <fraction word>": three quarters, two thirds; "a/one half"
    count_ok = card is not None and value == int(value) and 0 < value < 20
    if j < len(toks) and toks[j][0] in _FRACTION_WORDS and count_ok and words <= 2:
        value = value / _FRACTION_WORDS[toks[j][0]]
        j, words = j + 1, words + 1
    elif card is None and w in ("a", "an") and i + 1 < len(toks) and toks[i + 1][0] in _FRACTION_WORDS:
        value, j, words = Fraction(1, _FRACTION_WORDS[toks[i + 1][0]]), i + 2, 2
    elif card is not None and j + 2 < len(toks) and toks[j][0] == "and" and toks[j + 1][0] in ("a", "an", "one") \
            and toks[j + 2][0] in _FRACTION_WORDS:
        value, j, words = value + Fraction(1, _FRACTION_WORDS[toks[j + 2][0]]), j + 3, words + 2
    elif card is None:
        return None
    if j < len(toks) and toks[j][0] == "percent":
        j, words = j + 1, words + 1
    return j, value, words


def number_word_leak(text: str, matcher: "AnswerMatcher") -> bool:
    """Whether `text` writes a numeric answer in words."""
    if matcher.value is None:
        return False
    target = abs(matcher.value)
    present = _NUMBER_WORD_GATE.intersection(_LETTERS.findall(text.lower()))
    if present <= _SMALL_WORDS:
        return False
    for n in number_words(text):
        if n.words == 1 and n.value <= 2:
            continue  # "one of them", "the two sides": not the answer
        if n.value == target or (n.percent and n.value / 100 == target):
            return True
    return False


# Arithmetic: spans of a plain-text rendering of the hint.
_EXPR_MAX_TOKENS = 64
_EXPR_MAX_BITS = 4096
_EXPR_MAX_EXPONENT = 64
_EXPR_TOKEN = re.compile(
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d+(?:\.\d+)?|\.\d+)(?P<pct>\s*%)?"
    r"|(?P<op>\*\*|[-+*/^()])|(?P<sqrt>sqrt)|(?P<root>root(?P<n>\d))|(?P<other>\S)"
)
# A run of arithmetic characters (numbers, operators, parentheses, sqrt/rootN, spaces).
_ARITH_SPAN = re.compile(r"(?:sqrt|root\d|[\d(]|\.(?=\d))(?:sqrt|root\d|[\d.,%+\-*/^()\s])*")
_OP_WORDS = (
    (re.compile(r"(?<=\d)\s+(?:times|x|X|multiplied\s+by)\s+(?=\d)"), " * "),
    (re.compile(r"(?<=\d)\s+plus\s+(?=\d)"), " + "),
    (re.compile(r"(?<=\d)\s+minus\s+(?=\d)"), " - "),
    (re.compile(r"(?<=\d)\s+(?:divided\s+by|over)\s+(?=\d)"), " / "),
    (re.compile(r"(?<=\d)\s+squared\b"), "^2"),
    (re.compile(r"(?<=\d)\s+cubed\b"), "^3"),
)
_OP_WORD_GATE = frozenset("times x multiplied plus minus divided over squared cubed".split())
_LATEX_OPS = re.compile(r"\\(?:times|cdot|ast)(?![A-Za-z])|[×·∗⋅]")
_LATEX_DIV = re.compile(r"\\div(?![A-Za-z])|÷")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_ROOT = re.compile(r"\\sqrt\s*\[\s*(\d)\s*\]\s*\{([^{}]*)\}")
_LATEX_SQRT = re.compile(r"\\sqrt\s*\{([^{}]*)\}|\\sqrt\s*(\d+)|√\s*\(?(\d+)\)?")
# Something to compute: an operator between digits, a root or fraction, 2(9) / (2)(9).
_DIGIT_OP = re.compile(r"[\d)}]\s*(?:[-+*/^×·÷(]|\\times|\\cdot|\\div)|\\sqrt|√|\\[dt]?frac")


def _plain_arithmetic(text: str) -> str:
    """`text` with LaTeX and operator words turned into plain arithmetic (number words as digits)."""
    t = _clean_latex(text).replace("$", " ")
    words = set(_LETTERS.findall(t.lower()))
    spelled = _NUMBER_WORD_GATE.intersection(words)
    if spelled and not (spelled <= _SMALL_WORDS and _OP_WORD_GATE.isdisjoint(words)):
        for n in reversed(number_words(t)):
            v = n.value / 100 if n.percent else n.value
            rendered = str(v.numerator) if v.denominator == 1 else f"({v.numerator}/{v.denominator})"
            t = t[: n.start] + rendered + t[n.end :]
    if "\\" in t or "√" in t or "×" in t or "·" in t or "÷" in t:
        t = _LATEX_DIV.sub(" / ", _LATEX_OPS.sub(" * ", t))
        for _ in range(4):  # nested \frac / \sqrt, innermost first
            t2 = _LATEX_ROOT.sub(r" root\1(\2) ", t)
            t2 = _LATEX_FRAC.sub(r"((\1)/(\2))", t2)
            t2 = _LATEX_SQRT.sub(lambda m: f" sqrt({m.group(1) or m.group(2) or m.group(3)}) ", t2)
            if t2 == t:
                break
            t = t2
        t = t.replace("{", "(").replace("}", ")")
    if not _OP_WORD_GATE.isdisjoint(words):
        for pattern, repl in _OP_WORDS:
            t = pattern.sub(repl, t)
    return t


class _TooBig(Exception):
    pass


def _check_size(v: Fraction) -> Fraction:
    if v.numerator.bit_length() > _EXPR_MAX_BITS or v.denominator.bit_length() > _EXPR_MAX_BITS:
        raise _TooBig
    return v


def _exact_root(v: Fraction, n: int) -> Fraction | None:
    """The exact n-th root of a rational, or None when it is irrational (or v < 0 for even n)."""
    if v < 0:
        if n % 2 == 0:
            return None
        r = _exact_root(-v, n)
        return -r if r is not None else None

    def iroot(x: int) -> int | None:
        r = round(x ** (1.0 / n)) if x < 2**1000 else int(x ** (1.0 / n))
        for c in (r - 1, r, r + 1):
            if c >= 0 and c**n == x:
                return c
        return None

    a, b = iroot(v.numerator), iroot(v.denominator)
    return Fraction(a, b) if a is not None and b is not None else None


class _Parser:
    """Recursive descent over arithmetic tokens; every value an exact Fraction (None: not a rational)."""

    def __init__(self, toks: list[tuple[str, object]]):
        self.toks = toks
        self.i = 0

    def peek(self) -> tuple[str, object] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str, value: object = None) -> bool:
        t = self.peek()
        if t is not None and t[0] == kind and (value is None or t[1] == value):
            self.i += 1
            return True
        return False

    def expr(self) -> Fraction | None:
        v = self.term()
        while True:
            if self.take("op", "+"):
                w = self.term()
                v = None if v is None or w is None else _check_size(v + w)
            elif self.take("op", "-"):
                w = self.term()
                v = None if v is None or w is None else _check_size(v - w)
            else:
                return v

    def term(self) -> Fraction | None:
        v = self.unary()
        while True:
            t = self.peek()
            if self.take("op", "*"):
                w = self.unary()
                v = None if v is None or w is None else _check_size(v * w)
            elif self.take("op", "/"):
                w = self.unary()
                v = None if v is None or w is None or w == 0 else _check_size(v / w)
            elif t is not None and (t == ("op", "(") or t[0] in ("sqrt", "root")):  # 2(9), 3 sqrt(4): implicit product
                w = self.unary()
                v = None if v is None or w is None else _check_size(v * w)
            else:
                return v

    def unary(self) -> Fraction | None:
        if self.take("op", "-"):
            v = self.unary()
            return None if v is None else -v
        if self.take("op", "+"):
            return self.unary()
        return self.power()

    def power(self) -> Fraction | None:
        base = self.atom()
        if self.take("op", "^") or self.take("op", "**"):
            exp = self.unary()  # right-associative: 2^3^2 = 2^9
            if base is None or exp is None:
                return None
            if exp.denominator != 1:
                root = _exact_root(base, exp.denominator) if exp.denominator <= 10 else None
                if root is None:
                    return None
                base, exp = root, Fraction(exp.numerator)
            e = int(exp)
            if abs(e) > _EXPR_MAX_EXPONENT or (base.numerator.bit_length() + base.denominator.bit_length()) * abs(e) > 2 * _EXPR_MAX_BITS:
                raise _TooBig
            if base == 0 and e < 0:
                return None
            return _check_size(base**e)
        return base

    def atom(self) -> Fraction | None:
        t = self.peek()
        if t is None:
            raise SyntaxError
        kind, value = t
        if kind == "num":
            self.i += 1
            return value  # type: ignore[return-value]
        if self.take("op", "("):
            v = self.expr()
            if not self.take("op", ")"):
                raise SyntaxError
            return v
        if kind in ("sqrt", "root"):
            self.i += 1
            v = self.atom() if self.peek() != ("op", "(") else self.atom()
            return None if v is None else _exact_root(v, 2 if kind == "sqrt" else int(value))  # type: ignore[arg-type]
        raise SyntaxError


def _arithmetic_runs(text: str) -> list[list[tuple[str, object]]]:
    """The runs of arithmetic in `text` worth evaluating: spans of numbers and operators with at least
    one operation. A span that an operator or a letter joins to a variable (``2*2^{n-3}``, ``x+2*9``,
    ``2*9x``) is part of a larger expression and is skipped."""
    runs: list[list[tuple[str, object]]] = []
    for m in _ARITH_SPAN.finditer(text):
        span = m.group(0)
        if not _HAS_DIGIT.search(span):
            continue
        a = m.start()
        stripped = span.rstrip()
        tail = a + len(stripped)
        before = text[a - 1] if a > 0 else " "
        after = text[tail] if tail < len(text) else " "
        # a variable glued to the run ("9x", "x2"), or an operator reaching out to one ("x + 2*9", "2*2^(n")
        if before.isalpha() or before == "\\" or after.isalpha():
            continue
        pre = text[:a].rstrip()
        if pre[-1:] in ("*", "/", "^", "+", "-") and pre[:-1].rstrip()[-1:].isalnum():
            continue
        if stripped.rstrip(".,;:!?")[-1:] in ("*", "/", "^", "+", "-", "(") and text[tail:].lstrip()[:1].isalpha():
            continue
        run = _tokens(stripped.rstrip(".,;:!?").rstrip())
        if run:
            runs.append(run)
    return runs


def _tokens(span: str) -> list[tuple[str, object]] | None:
    """Tokens of one arithmetic span, trimmed of prose punctuation; None when there is nothing to compute."""
    cur: list[tuple[str, object]] = []
    for m in _EXPR_TOKEN.finditer(span):
        if m.group("num") is not None:
            digits = m.group("num").replace(",", "")
            if len(digits) > _MAX_DIGITS:
                return None
            v = Fraction("0" + digits if digits.startswith(".") else digits) if "." in digits else Fraction(int(digits))
            if m.group("pct"):
                v /= 100
            cur.append(("num", v))
        elif m.group("op") is not None:
            cur.append(("op", "^" if m.group("op") == "**" else m.group("op")))
        elif m.group("sqrt") is not None:
            cur.append(("sqrt", 2))
        elif m.group("root") is not None:
            cur.append(("root", int(m.group("n"))))
        else:
            return None  # a stray '.' or ',' inside: a list or a sentence, not one expression
        if len(cur) > _EXPR_MAX_TOKENS:
            return None
    while cur and cur[-1][0] == "op" and cur[-1][1] != ")":
        cur.pop()  # "18 -" at the end of a clause
    while cur and cur[0][0] == "op" and cur[0][1] in ("*", "/", "^", ")", "+"):
        cur.pop(0)
    # parentheses that do not pair up inside the span belong to the prose around it
    depth, drop = 0, set()
    for k, t in enumerate(cur):
        if t == ("op", "("):
            depth += 1
        elif t == ("op", ")"):
            if depth == 0:
                drop.add(k)
            else:
                depth -= 1
    if depth:
        drop.update([k for k, t in enumerate(cur) if t == ("op", "(")][:depth])
    run = [t for k, t in enumerate(cur) if k not in drop]
    ops = sum(1 for kind, value in run if (kind == "op" and value not in ("(", ")")) or kind in ("sqrt", "root"))
    ops += sum(1 for x, y in zip(run, run[1:]) if y == ("op", "(") and (x[0] == "num" or x == ("op", ")")))
    nums = sum(1 for kind, _ in run if kind == "num")
    if not nums or not ops or (nums == 1 and ops == 1 and run[0] == ("op", "-")):
        return None
    return run


def expression_leak(text: str, matcher: "AnswerMatcher") -> bool:
    """Whether some arithmetic in `text` evaluates exactly to a numeric answer."""
    if matcher.value is None:
        return False
    if not _DIGIT_OP.search(text):
        words = _LETTERS.findall(text.lower())
        if _OP_WORD_GATE.isdisjoint(words) or _NUMBER_WORD_GATE.isdisjoint(words) and not _HAS_DIGIT.search(text):
            return False
    target = matcher.value
    for run in _arithmetic_runs(_plain_arithmetic(text)):
        p = _Parser(run)
        try:
            v = p.expr()
        except (SyntaxError, _TooBig, ZeroDivisionError, OverflowError, ValueError):
            continue
        if p.i == len(run) and v is not None and v == target:
            return True
    return False


_ANSWER_LABEL = re.compile(
    r"^\s*(?:\*\*|__)?\s*(?:(?:the\s+)?final\s+answer|answer|ans|a|result|solution|sol|output)\s*(?:\*\*|__)?\s*[:=]\s*", re.I
)
_HINT_LABEL = re.compile(r"^\s*(?:\*\*|__)?\s*hint\s*(?:\*\*|__)?\s*[:=]\s*", re.I)
_WRAPPERS = re.compile(r"\\boxed\s*\{|\\\(|\\\)|\\\[|\\\]|\$|\*\*|__|`")
_BARE_VALUE = re.compile(
    r"[-+]?\s*(?:\\\$|\$|€|£)?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|\\%)?"  # 66, $1,200, 12.5%, .5
    r"|[-+]?\s*\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}"  # \frac{1}{2}
    r"|[-+]?\s*\d+\s*/\s*\d+"  # 1/2
)
_VARIABLE_IS = re.compile(r"[A-Za-z]\s*=\s*(.+)")  # x = 5 (a value, not "x = the number of eggs")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_LATEX_NAMES = re.compile(r"\\(?:begin|end)\s*\{[A-Za-z*]*\}?|\\[A-Za-z]+")  # \begin{pmatrix}, \frac: not prose
_LEADING_VALUE = re.compile(r"[-+]?\s*(?:\\\$|\$|€|£)?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|\\%)?")


_THREE_WORDS = re.compile(r"[A-Za-z]{3,}[^A-Za-z\d]+[A-Za-z]{3,}[^A-Za-z\d]+[A-Za-z]{3,}")


def answer_only(text: str) -> bool:
    """Whether the hint is only an answer: ``A: 66``, ``Answer: twelve``, ``66``, ``$\\frac{1}{2}$``, ``x = 5``,
    ``66 dollars``, ``Eighteen``, or arithmetic with no words around it."""
    t = text.strip()
    h = _HINT_LABEL.match(t)
    if h:
        t = t[h.end():]  # "Hint: ..." is judged by what follows
    m = _ANSWER_LABEL.match(t)
    if not m and _THREE_WORDS.search(t):
        return False  # prose: the usual case, decided without the checks below
    body = t[m.end():] if m else t
    body = _WRAPPERS.sub(" ", body).replace("}", " ").strip().rstrip(".!;,").strip()
    if not body:
        return bool(m)
    words = _PROSE_WORD.findall(_LATEX_NAMES.sub(" ", body))
    if m and (len(body.split()) <= 4 or not words):
        return True  # "A: 66", "Answer: 12 apples": an answer line, not a direction
    spelled = number_words(body)
    if len(spelled) == 1 and len((body[: spelled[0].start] + body[spelled[0].end :]).split()) <= 2:
        return True  # "Eighteen", "twelve apples"
    if not _HAS_DIGIT.search(body):
        return False
    head = _LEADING_VALUE.match(body)
    if head and head.end() > 0 and len(body[head.end():].split()) <= 2:
        return True  # "66", "66 dollars", "$1,200 in total"
    if _BARE_VALUE.fullmatch(body):
        return True
    var = _VARIABLE_IS.fullmatch(body)
    if var and not _PROSE_WORD.search(var.group(1)):
        return True
    return not words  # "2*9", "3^3 + 1": arithmetic with no prose at all


def indirect_leak(text: str, matcher: "AnswerMatcher") -> bool:
    """`expression_leak` or `number_word_leak`: the answer computed or spelled out."""
    return expression_leak(text, matcher) or number_word_leak(text, matcher)
