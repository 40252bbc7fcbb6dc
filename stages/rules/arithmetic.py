"""`expression_leak`: arithmetic in a hint that evaluates to the answer (``3^3`` for 27, ``2*9``,
``\\sqrt{81}``, ``nine times two``).

A bounded parser: every value is an exact rational, and exponents, sizes and
token counts are capped, so a hostile hint cannot make the guard slow.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import TYPE_CHECKING

from mentor.stages.rules.numbers import HAS_DIGIT, MAX_DIGITS, clean_latex
from mentor.stages.rules.words import LETTERS, NUMBER_WORD_GATE, SMALL_WORDS, number_words

if TYPE_CHECKING:
    from mentor.stages.rules.numbers import AnswerMatcher

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
    t = clean_latex(text).replace("$", " ")
    words = set(LETTERS.findall(t.lower()))
    spelled = NUMBER_WORD_GATE.intersection(words)
    if spelled and not (spelled <= SMALL_WORDS and _OP_WORD_GATE.isdisjoint(words)):
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
        if not HAS_DIGIT.search(span):
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
            if len(digits) > MAX_DIGITS:
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


def expression_leak(text: str, matcher: AnswerMatcher) -> bool:
    """Whether some arithmetic in `text` evaluates exactly to a numeric answer."""
    if matcher.value is None:
        return False
    if not _DIGIT_OP.search(text):
        words = LETTERS.findall(text.lower())
        if _OP_WORD_GATE.isdisjoint(words) or NUMBER_WORD_GATE.isdisjoint(words) and not HAS_DIGIT.search(text):
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
