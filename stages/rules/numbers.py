"""Numbers in a hint and `AnswerMatcher`: does a text contain the reference answer in any equivalent form?

Every number in the text (integers, thousands separators, decimals, repeating
decimals written ``4.666…``/``4.(6)``, fractions ``14/3``, mixed numbers
``4 2/3``, ``\\frac{14}{3}``, percents) is turned into an exact rational and
compared with a numeric reference answer; a decimal with d digits also leaks
when it is the answer rounded to d digits. Everything else (LaTeX segments,
boxed content, expressions, non-numeric answers such as ``p - q`` or
``(3, \\frac{\\pi}{2})``) is compared with math-verify. Other numbers of the
problem (``3 apples``) pass, unless they equal the answer. Number words and
arithmetic are read by `words` and `arithmetic`, not here.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

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
HAS_DIGIT = re.compile(r"\d")
MAX_DIGITS = 1000  # longer digit runs are not numbers to compare (int() refuses past 4300 digits)
_LONG_DIGITS = re.compile(r"\d{%d,}" % (MAX_DIGITS + 1))


@dataclass(frozen=True, slots=True)
class Num:
    value: Fraction
    approx_digits: int | None  # None: exact; d: a decimal with d digits (a rounding may leak)


def _quotient(m: re.Match) -> Fraction | None:
    a, b = Fraction(m.group(1)), Fraction(m.group(2))
    return a / b if b else None


def _mixed(m: re.Match) -> Fraction | None:
    w, a, b = int(m.group(1)), int(m.group(2)), int(m.group(3))
    return w + Fraction(a, b) if b else None


def _proper_mixed(m: re.Match) -> Fraction | None:
    """A mixed number written with a slash: "4 2/3", not "4 5/3" (two numbers, then a ratio)."""
    return _mixed(m) if int(m.group(2)) < int(m.group(3)) else None


# The spans that hold one value, in the order they claim their digits: "4\frac{2}{3}", "\frac{14}{3}", "\frac12",
# "4 2/3", "14/3".
_SPANS = (
    (_MIXED_LATEX, _mixed),
    (_FRAC, _quotient),
    (_FRAC_SHORT, lambda m: Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None),
    (_MIXED, _proper_mixed),
    (_RATIO, _quotient),
)


def parse_numbers(text: str) -> list[Num]:
    """Every number in `text` as an exact rational (fractions and mixed numbers resolved)."""
    out: list[Num] = []
    if not HAS_DIGIT.search(text):
        return out
    if len(text) > MAX_DIGITS:
        text = _LONG_DIGITS.sub(" ", text)  # not numbers to compare, and int() refuses them
    # Digits inside a fraction or mixed number belong to that value, not to separate numbers
    # (the 3 of "1/3" is not the answer 3).
    taken: list[tuple[int, int]] = []

    def free(m: re.Match) -> bool:
        a, b = m.span()
        return not any(s < b and a < e for s, e in taken)

    for pattern, value_of in _SPANS:
        for m in pattern.finditer(text):
            v = value_of(m)
            if v is not None and free(m):
                out.append(Num(v, None))
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
    t = clean_latex(text)
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
    if m and len(t) <= MAX_DIGITS:
        return Fraction(t.replace(",", ""))
    return None


def clean_latex(text: str) -> str:
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
    t = clean_latex(text)
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
    from math_verify import parse  # slow to import (sympy)
    from math_verify.errors import TimeoutException  # likewise

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
    from math_verify import verify  # slow to import (sympy)
    from math_verify.errors import TimeoutException  # likewise

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
            parts = [_plain_number(p) for p in clean_latex(self.answer).strip("()[]{} ").split(",")]
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
            self._gold = _mv_parse(clean_latex(self.answer)) if self.answer else []
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
        if self.value is not None and not HAS_DIGIT.search(text):
            return False  # a rational answer needs a digit (number words are not read; see module doc)
        clean = clean_latex(text)
        if self.value is not None:
            if self._number_leaks(parse_numbers(clean)):
                return True
            if "\\" not in clean and "^" not in clean:
                return False  # plain text: every number was compared exactly above
        else:
            if self.values:
                found = {abs(n.value) for n in parse_numbers(clean)}
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
                if self._number_leaks(parse_numbers(seg)):
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
