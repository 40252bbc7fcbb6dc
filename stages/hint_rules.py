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
                             operation or equation relating them
- ``list_header``            only a lead-in with nothing after it ("Here's the
                             step-by-step breakdown:", "Let's solve it:")
- ``solution_code``          (code) a function defining the entry point
- ``repeats_previous_hint``  identical to a hint of an earlier round
- ``wrong_language``         mostly non-Latin script for a Latin-script problem

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
    "solution_code",
    "repeats_previous_hint",
    "wrong_language",
)

DESCRIPTIONS = {
    "empty": "the hint is empty",
    "too_long": "the hint is too long: one to three short sentences",
    "answer_leak": "the hint reveals the final answer (in some form); remove every trace of it",
    "final_answer_line": "the hint states a final answer ('the answer is', boxed); point a direction instead",
    "full_solution": "the hint works out the solution step by step; give only the key idea",
    "restates_problem": "the hint only restates the problem; name the idea the solver is missing",
    "restates_numbers": "the hint repeats the problem's numbers; name the relation or first step instead of the data",
    "list_header": "the hint is only a lead-in ('Here is the breakdown:'); write the hint itself",
    "solution_code": "the hint contains the solution code; describe the approach in words",
    "repeats_previous_hint": "the hint repeats an earlier hint; go one step further",
    "wrong_language": "the hint is not in the language of the problem",
    # control-flow violations (set by the hint stage, not by these rules)
    "parse_error": "the output was not the requested JSON",
    "truncated": "the output was cut at the token limit",
    "judge_low_score": "the judge scored the hint below the threshold",
    "judge_parse_error": "the judge's output was not the requested JSON",
}


@dataclass(frozen=True)
class RuleLimits:
    """Bounds of an acceptable hint."""

    max_chars: int = 500
    max_sentences: int = 4
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


@dataclass(frozen=True, slots=True)
class Num:
    value: Fraction
    approx_digits: int | None  # None: exact; d: a decimal with d digits (a rounding may leak)


def _parse_numbers(text: str) -> list[Num]:
    """Every number in `text` as an exact rational (fractions and mixed numbers resolved)."""
    out: list[Num] = []
    if not _HAS_DIGIT.search(text):
        return out
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
    if m:
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


_SMALL_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_SMALL_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
                     "hundred": 100, "half": None, "twice": None, "double": None})  # type: ignore[dict-item]
_WORD_RE = re.compile(r"[a-z]+")


def _data_numbers(text: str) -> set[Fraction]:
    """The quantities a text states: its numbers, and small numbers written as words ("three", "forty").

    0, 1 and 2 are left out: they appear in any explanation ("the two values", "f(0)"), not only as data.
    """
    vals = {abs(n.value) for n in _parse_numbers(_clean_latex(text))}
    vals.update(Fraction(_SMALL_WORDS[w]) for w in _WORD_RE.findall(text.lower()) if _SMALL_WORDS.get(w) is not None)
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
    return shared >= 3 and shared >= 0.6 * len(given) and mine <= given and not _OPERATION.search(hint)


_OPERATION = re.compile(r"=|\d\s*%?\s*[-+*/×÷x]\s*\$?\d|\\(?:times|cdot|div|frac)")


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


def check_hint(hint: str, ctx: RuleContext) -> list[str]:
    """The names of every rule `hint` violates (empty list: it passes)."""
    text = hint.strip() if hint else ""
    if not _ALNUM.search(text):
        return ["empty"]
    out: list[str] = []
    lim = ctx.limits
    if len(text) > lim.max_chars or sentence_count(text) > lim.max_sentences:
        out.append("too_long")
    if ctx.matcher.leaks(text):
        out.append("answer_leak")
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
    return ctx.matcher.leaks(text)
