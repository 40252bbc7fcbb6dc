"""Math answers whose evaluation would explode, refused before math-verify sees them.

``\\boxed{10^{10^{10}}}``, ``3^{3^{15}}`` or ``100000000!`` make sympy build a
number of millions or billions of digits, ``(a+b+c+d)^{20}`` an expansion of
thousands of terms, inside C calls that math-verify's alarm cannot interrupt:
each such sample held a math worker for 3-4 s here, and the pool has two.
`explosive(answer)` reads the answer once, left to right, and bounds what it
denotes without computing anything: each part carries an upper bound of its
size in decimal digits when it is a number (exponents and factorials taken at
the largest value their own bound allows) and of the number of terms its
expansion could have when it holds symbols. The answer is refused (scored 0,
math-verify never called) when some part would need more than `DIGITS` digits,
a factorial, Gamma or binomial of more than `FACTORIAL`, a symbol raised past
`POWER`, an expansion of more than `TERMS` terms, a sum or product of more than
`RANGE` terms, brackets or exponents nested deeper than `DEPTH`, brackets that
group ((...), [...], {...} other than a command's argument) nested deeper than
`GROUPS` or exponents nested deeper than `EXPONENTS` (each level of either costs
the LaTeX parser's prediction 0.04-0.1 s of CPU, issue 58), or more than
`LENGTH` characters, or a number of more than `PRECISION` digits (written out, or
as a power such as ``10^{-900}``) inside a function's argument, a root or an
exponent, or raised to a power: ``\\cos(10^{-900})`` is 1 to 900 digits, and
sympy evaluated it to thousands of digits to tell it from 1 (0.1 s of a worker's
CPU at 900 digits, 1 s at 4,000; past 4,300, x + \\cos(10^{-4400}) scored 1.0 for
x + 1, issue 58). `explosive` returns why, a `Refusal` whose `kind` names the
bound (the counter `verify.MATH_STATS` counts refusals by it).

The bounds sit far above ordinary answers: none of 12,871 final answers (the
MATH-500 and GSM8K references, the bundled GSM8K rollouts, the model solutions
in shared/data/gsm8k and the MATH-500 reference solutions) is refused, and an
answer identical to its reference is accepted before this check runs.
"""

from __future__ import annotations

import math
import re

from mentor.training.math_forms import normalize

DIGITS = 10_000  # digits of any number the answer denotes (2^{2005} has 604)
FACTORIAL = 2_000  # n!, Gamma(n), and the smaller side of a binomial
POWER = 1_000  # exponent of a base that holds symbols
TERMS = 400  # terms of the expansion of a symbolic part ((x+y+z)^{30} has 496; (x+1)^{100} 101)
RANGE = 1_000  # upper limit of a \sum or \prod
DEPTH = 40  # nesting of brackets and exponents
GROUPS = 2  # nesting of brackets that group: (...), [...], \\{...\\} and {...} other than a command's argument
EXPONENTS = 2  # nesting of exponents (2^{2^{2}})
LENGTH = 2_000  # characters
PRECISION = 100  # digits of a number inside a function, root or exponent, or raised to a power (\cos(10^{-900}))

# Digit groups joined by thousands separators count as one number (math-verify reads "1,000,000" so).
_TOKEN = re.compile(r"\d+(?:(?:,|\{,\}|\\[,;:! ]|\s)*\d+)*(?:\.\d+)?|\*\*|\\[A-Za-z]+|\\.|\s+|.", re.DOTALL)
_OPEN = {"(": ")", "[": "]", "{": "}", "\\{": "\\}", "\\lbrace": "\\rbrace"}
_CLOSE = {")", "]", "}", "\\}", "\\rbrace"}
_SKIP = {"\\left", "\\right", "\\big", "\\Big", "\\bigg", "\\Bigg", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ",
         "\\quad", "\\qquad", "$"}
_TIMES = {"*", "\\cdot", "\\times", "/", "\\div", "\\over"}
_NOT_FACTOR = set("+-=<>,;&|!^_'") | {"\\\\", "**", "\\choose"} | _CLOSE
_FRAC = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\binom", "\\dbinom", "\\tbinom"}
_TEXT = {"\\text", "\\mbox", "\\mathrm", "\\textbf", "\\mathbf", "\\textit", "\\mathit", "\\operatorname", "\\mathbb", "\\mathcal"}
_FUNCTIONS = {"\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\arcsin", "\\arccos", "\\arctan", "\\arccot",
              "\\sinh", "\\cosh", "\\tanh", "\\coth", "\\log", "\\ln", "\\lg", "\\operatorname"}
_CONST = {"e": math.log10(math.e), "\\pi": math.log10(math.pi)}
_LOG10 = math.log(10)

# A part of the answer: (digits, terms): log10 bounds of its size when it is a number (digits not None),
# and of the number of terms of its expansion (0 for a number or a single product of symbols).
_SYMBOL = (None, 0.0)


class Explosive(ValueError):
    """An answer whose evaluation would explode (the message says which bound it passes)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Refusal(str):
    """Why an answer is refused (the text), with `kind`, the bound it passes (a counter's name)."""

    kind: str

    def __new__(cls, message: str, kind: str) -> "Refusal":
        out = super().__new__(cls, message)
        out.kind = kind
        return out


def _number(digits: str) -> float:
    """log10 of the integer written with these digits (separators and the decimal point ignored)."""
    d = re.sub(r"\D", "", digits).lstrip("0")
    if not d:
        return 0.0
    return len(d) - 1 + math.log10(int(d[:15]) / 10 ** (min(15, len(d)) - 1))


def _value(size: float) -> float:
    """The largest value a number of this size (log10) can have (a hair less: log10 rounds)."""
    return math.inf if size > 300 else 10.0 ** size * (1 - 1e-9)


def _log_add(a: float, b: float) -> float:
    return max(a, b) + math.log10(1 + 10.0 ** (min(a, b) - max(a, b)))


class _Reader:
    """A recursive-descent pass over the tokens: sums of products of powers/factorials of atoms."""

    def __init__(self, tokens: list[str]) -> None:
        self.t, self.i, self.depth, self.groups, self.exponents = tokens, 0, 0, 0, 0
        self.inner = 0  # how many function arguments, roots and exponents enclose the reader (see PRECISION)

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str | None:
        tok = self.peek()
        self.i += 1
        return tok

    def enter(self) -> None:
        self.depth += 1
        if self.depth > DEPTH:
            raise Explosive(f"brackets or exponents nested more than {DEPTH} deep", "depth")

    def part(self, digits: float | None, terms: float) -> tuple[float | None, float]:
        if digits is not None and digits > DIGITS:
            raise Explosive(f"a number of more than {DIGITS} digits", "digits")
        if digits is not None and digits > PRECISION and self.inner:
            self.imprecise()
        if terms > math.log10(TERMS):
            raise Explosive(f"an expansion of more than {TERMS} terms", "terms")
        return digits, terms

    def imprecise(self) -> None:
        raise Explosive(f"a number of more than {PRECISION} digits inside a function, root or exponent, "
                        "or raised to a power", "precision")

    def inside(self, read):
        """What `read()` reads, as a function's argument, a root or an exponent (see PRECISION)."""
        self.inner += 1
        try:
            return read()
        finally:
            self.inner -= 1

    def starts_factor(self) -> bool:
        tok = self.peek()
        return tok is not None and tok not in _NOT_FACTOR

    def expr(self, close: str | None = None) -> tuple[float | None, float]:
        """Terms up to `close` (or the end): each further term at most doubles a number and adds its terms."""
        out: tuple[float | None, float] | None = None
        while self.peek() is not None and self.peek() != close and self.peek() not in _CLOSE:
            if self.peek() == "\\choose":  # {n \choose k}
                self.take()
                self.factorial(self.term(close))
                continue
            if self.peek() in _TIMES or not self.starts_factor():
                self.take()  # +, -, =, commas, relations...
                continue
            d, t = self.term(close)
            if out is not None:
                d = None if d is None or out[0] is None else max(d, out[0]) + math.log10(2)
                t = _log_add(t, out[1])
            out = self.part(d, t)
        if close is not None and self.peek() == close:
            self.take()
        return out or (0.0, 0.0)

    def term(self, close: str | None) -> tuple[float | None, float]:
        """Factors multiplied or divided (also implicitly): digits and terms add up."""
        d, t = self.factor()
        while self.peek() is not None and self.peek() != close:
            if self.peek() in _TIMES:
                self.take()
            elif not self.starts_factor():
                break
            fd, ft = self.factor()
            d, t = self.part(None if d is None or fd is None else d + fd, t + ft)
        return d, t

    def factor(self) -> tuple[float | None, float]:
        out = self.atom()
        while True:
            tok = self.peek()
            if tok in ("^", "**"):
                self.take()
                out = self.power(out, self.exponent())
            elif tok == "!":
                self.take()
                out = self.factorial(out)
            elif tok in ("_", "'"):
                self.take()
                if tok == "_":
                    self.exponent()  # a subscript: read for what it holds, its value unused
            else:
                return out

    def exponent(self) -> tuple[float | None, float]:
        """What a ^ or _ applies: a braced group, else the next factor (``10**10**10`` is 10**(10**10))."""
        self.enter()
        self.exponents += 1
        if self.exponents > EXPONENTS:
            raise Explosive(f"exponents nested more than {EXPONENTS} deep", "exponents")
        try:
            if self.peek() == "{":  # the exponent's own braces: an argument, not a group
                self.take()
                return self.inside(lambda: self.expr("}"))
            return self.inside(self.factor)
        finally:
            self.depth -= 1
            self.exponents -= 1

    def power(self, base: tuple[float | None, float], exp: tuple[float | None, float]) -> tuple[float | None, float]:
        if base[0] is not None and base[0] > PRECISION:
            self.imprecise()  # (1 + 10^{-900})^{\frac12}
        if exp[0] is None:
            return _SYMBOL  # a symbolic exponent: nothing is expanded
        n = _value(exp[0])
        if base[0] is not None:
            return self.part(0.0 if base[0] == 0 else n * base[0], 0.0)
        if n > POWER:
            raise Explosive(f"a power of a symbol with an exponent over {POWER}", "power")
        k = 10.0 ** base[1]  # terms of the base; its n-th power has at most C(n + k - 1, k - 1)
        terms = (math.lgamma(n + k) - math.lgamma(k) - math.lgamma(n + 1)) / _LOG10 if k > 1 else 0.0
        return self.part(None, max(terms, 0.0))

    def factorial(self, arg: tuple[float | None, float]) -> tuple[float | None, float]:
        if arg[0] is None:
            return _SYMBOL
        n = _value(arg[0])
        if n > FACTORIAL:
            raise Explosive(f"a factorial (or Gamma, or binomial) of more than {FACTORIAL}", "factorial")
        return self.part(math.lgamma(n + 1) / _LOG10, 0.0)

    def group(self) -> tuple[float | None, float]:
        tok = self.peek()
        if tok in _OPEN:
            self.take()
            return self.expr(_OPEN[tok])
        return self.factor() if self.starts_factor() else _SYMBOL

    def function(self) -> tuple[float | None, float]:
        """A function's powers or base (``\\sin^{2}``, ``\\log_{2}``), then its argument, the next factor."""
        out = _SYMBOL
        while self.peek() in ("^", "_"):
            if self.take() == "^":
                out = self.power(out, self.exponent())  # \sin^{1000}(x): POWER
            else:
                self.exponent()
        if self.starts_factor():
            self.inside(self.factor)
        return out

    def atom(self) -> tuple[float | None, float]:
        self.enter()
        try:
            return self.read_atom()
        finally:
            self.depth -= 1

    def read_atom(self) -> tuple[float | None, float]:
        tok = self.take()
        if tok is None:
            return _SYMBOL
        if tok[0].isdigit():
            if self.inner and sum(c.isdigit() for c in tok) > PRECISION:
                self.imprecise()  # \cos(0.000...0001)
            return self.part(_number(tok), 0.0)
        if tok in _OPEN:  # a group: what the LaTeX parser's prediction pays for per level (see GROUPS)
            self.groups += 1
            if self.groups > GROUPS:
                raise Explosive(f"brackets nested more than {GROUPS} deep", "groups")
            try:
                return self.expr(_OPEN[tok])
            finally:
                self.groups -= 1
        if tok in _CONST:
            return _CONST[tok], 0.0
        if tok in _FRAC:
            top, bottom = self.group(), self.group()
            if tok.endswith("binom"):
                self.factorial(bottom)
            return self.part(None if top[0] is None or bottom[0] is None else top[0] + bottom[0], top[1] + bottom[1])
        if tok == "\\sqrt":
            if self.peek() == "[":
                self.take()
                self.inside(lambda: self.expr("]"))
            return self.inside(self.group)
        if tok in ("\\Gamma", "\\exp"):
            arg = self.inside(self.group)
            return self.factorial(arg) if tok == "\\Gamma" else self.power((_CONST["e"], 0.0), arg)
        if tok in ("\\sum", "\\prod"):
            while self.peek() in ("_", "^"):
                if self.take() == "^":
                    top = self.exponent()
                    if top[0] is not None and _value(top[0]) > RANGE:
                        raise Explosive(f"a sum or product of more than {RANGE} terms", "range")
                else:
                    self.exponent()
            return _SYMBOL
        if tok in _TEXT and self.peek() == "{":
            self.take()
            self.expr("}")
        if tok in _FUNCTIONS:
            return self.function()
        return _SYMBOL  # a letter, a word of text or another command


def explosive(answer: str) -> Refusal | None:
    """Why evaluating `answer` would explode (see the module docstring), or None for an ordinary answer."""
    if len(answer) > LENGTH:
        return Refusal(f"more than {LENGTH} characters", "length")
    answer = normalize(answer)  # what math-verify will parse (math_compare does the same)
    reader = _Reader([t for t in _TOKEN.findall(answer) if not t.isspace() and t not in _SKIP])
    try:
        while reader.peek() is not None:
            reader.expr()
            if reader.peek() is not None:
                reader.take()  # a stray closing bracket
    except Explosive as exc:
        return Refusal(str(exc), exc.kind)
    return None
