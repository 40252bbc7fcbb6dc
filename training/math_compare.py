"""Math answers compared exactly where they can be; runs inside the math-verify worker processes.

math-verify parses both answers (LaTeX -> sympy) and its `verify` decides most kinds, but three of
its defaults admit wrong answers, and no setting of it removes them:

- numbers: any float is compared after rounding to `float_rounding` decimal places (0.0 then
  equals every reference under 5e-7), a float expression is evaluated in 53 bits (``N + 0.0``
  equals N + 1 for a large N), and two expressions are equal when their difference, evaluated with
  ``chop=True``, is chopped to 0 (``\\frac{\\sqrt{2}}{10^{20}}`` equals ``1 - 1``). Raising
  `float_rounding` or `numeric_precision` only moves the threshold;
- bare letters are parsed as a product of symbols, whose factors sympy sorts: ``BDAC`` = ``ABCD``;
- an open interval ``(a, b)`` is compared with a two-element set as the pair (a, b), so the endpoints
  written as ``x = a \\text{ or } x = b`` match it.

So the types are chosen per answer here before math-verify compares what is left:

- a decimal is read as the exact number its digits write (``0.1`` is 1/10), never as a float;
- a reference of bare letters is compared as a string (`letters`);
- numbers (no free symbols) are compared here (`numbers_equal`): exactly, except a decimal answer
  against a reference no decimal can write (1/3, sqrt(2), pi), which must lie within a relative
  `TOLERANCE` of it (so 0 never matches a non-zero reference);
- intervals only equal intervals (open/closed ends kept), finite sets only finite sets or lists;
  sets, tuples, intervals and matrices are compared element by element with the same rules; one written
  with a comma then three digits led by a zero (``(2,050)``: (2, 50), or 2050 in parentheses?) equals nothing;
- an expression in symbols is first evaluated at a few fixed points (a wrong answer is refused
  there, cheaply, without sympy's `simplify`), and must be exactly equal at one of them (a difference
  under 10^{-30}, ``x + \\cos(10^{-20})`` for ``x + 1``, is proven or refused as between numbers; a check
  that fails there, ``x + \\cos(10^{-4400})``, is undecided, never equal); then math-verify decides on the
  exact expressions;
- two equations solved for one symbol (``y = f(x)``, ``y = h(x)``, or ``h(x) = y``; one linear in y solved for it,
  `math_relations.solved_like`) are compared as f and h, expressions;
- two relations whose sides (lhs - rhs) differ by a non-zero constant are not equal (``y = \\sin x + 10^{-20}``
  for ``y = \\sin x``: math-verify's chop passed it); two relations between polynomials are decided here, equal
  exactly when their sides are proportional by a non-zero number (`polynomial_relations`); any other pair of
  relations goes to math-verify, which solves both; these checks, the linear solve and math-verify run while the
  request has used less than `RELATION_CPU` from the answer's parse on (a reference is parsed once), then the
  answer is undecided;
- written forms math-verify misreads (``1\\,000``, ``3e-9``, ``0.\\overline{3}``, ``10^-9``) are rewritten first
  (`math_forms`).

The table of what counts as equal per answer kind is in docs/training.md ("Math: what counts as
equal"). Everything here runs under the worker's one alarm per request (`equal(..., seconds)`).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import sympy
from latex2sympy2_extended.sets import FiniteSet as ParsedFiniteSet
from math_verify import parse
from math_verify import verify as mv_verify
from math_verify.grader import get_pct_val, is_assignment_relation, is_equation, is_relation, take_last_relation

from mentor.training.math_forms import malformed, normalize
from mentor.training.math_numbers import DIGITS, POINTS, doit, exact, is_number, numbers_equal
from mentor.training.math_relations import (offset, polynomial_relations, proportional, solved_for_one_symbol, solved_like,
                                           symbol_first)
from sympy import Interval, MatrixBase, Rational, Tuple
from sympy.core.relational import Relational
from sympy import FiniteSet as SympyFiniteSet

# CPU seconds a request may have used, from the answer's parse on, when it has compared two relations not solved for one
# symbol (the exact checks, then math-verify, which solves two relations that are not both polynomial: seconds on
# x^2 + y^2 = (\sin x + \cos x)^{30}); past it the answer is undecided, scored 0.
# Issue 58: 0.1 s of trusted CPU a sample, the reward process's share and the pipes included. The timer stops a request
# at about this plus 6 ms; a full collection once added 0.07 s (0.10 s in CI), hence the workers' `gc.freeze`. Honest
# relations cost up to 0.027 s cold here (\sin x - y = 0 for y = \sin x): 0.03 s left too little room.
RELATION_CPU = 0.05
_request = {"cpu": 0.0}  # process CPU when `equal` had the reference (a worker serves one request at a time)

# A comma, then three digits led by a zero: in a list, tuple or interval (``(2,050)``) it reads as an element
# written with a leading zero, (2, 50), or as a thousands separator, 2050; such an answer is not equal to anything.
_ZERO_GROUP = re.compile(r"(?<=\d),0\d\d(?!\d)")
_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_NOISE = re.compile(r"\s+|\$|\\[,;:! ]|\\left|\\right|[(){}]")


class OverTime(BaseException):
    """Past the request's time (a BaseException, as math-verify's own: its `except Exception` lets it through)."""


class OverBudget(OverTime):
    """Past `RELATION_CPU`: math-verify solving two relations that are not both polynomial."""


@contextmanager
def request_alarm(seconds: float) -> Iterator[None]:
    """One real-time alarm for the whole request, else `OverTime` (math-verify's own alarms are off: nested
    alarms would cancel each other)."""

    def fire(signum, frame):
        raise OverTime

    old = signal.signal(signal.SIGALRM, fire)
    # Again every 50 ms, as `cpu_budget`'s timer: an exception raised where Python drops it (a finaliser, a
    # weakref or gc callback) is lost, and the request then ran on to the pool's deadline, which kills the worker.
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001), 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def letters(text: str) -> str | None:
    """The letters of an answer made of letters only (``BDAC``, ``\\text{(C)}``, ``\\text{Evelyn}``), or None."""
    for _ in range(4):  # wrappers nest at most a few deep in real answers
        text = _WRAPPER.sub(r"\1", text)
    s = _NOISE.sub("", text)
    return s if s and s.isascii() and s.isalpha() else None


def letters_equal(gold: str, pred: str) -> bool:
    """Same letters in the same order; case is ignored in words, kept in one letter (a variable)."""
    p = letters(pred)
    if p is None:
        return False
    return p == gold if len(gold) == 1 else p.lower() == gold.lower()


def _differs_somewhere(g, p) -> bool:
    """Whether two expressions in symbols take different values at one of `POINTS` (then they differ;
    when they agree everywhere here math-verify decides)."""
    symbols = sorted(g.free_symbols | p.free_symbols, key=str)
    for point in POINTS:
        values = {s: point[i % len(point)] + i for i, s in enumerate(symbols)}
        try:
            d = doit((g - p).subs(values))
            if d.is_Rational:
                if d != 0:
                    return True
                continue
            dv = d.evalf(DIGITS)
            size = abs(g.evalf(DIGITS, subs=values)) + abs(p.evalf(DIGITS, subs=values))
            if dv.is_number and size.is_number and dv.is_finite and size.is_finite and abs(dv) > Rational(1, 10**30) * (1 + size):
                return True
        except Exception:
            continue
    return False


@contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """At most `seconds` of this process's CPU (user and system) for the block, else `OverBudget` (a profiling
    timer: SIGPROF, apart from the request's real-time alarm)."""

    def fire(signum, frame):
        raise OverBudget

    if signal.getitimer(signal.ITIMER_PROF)[0] > 0:
        yield  # within a budget already (a comparison nested in a relation's): the outer one holds
        return
    if seconds <= 0:
        raise OverBudget
    old = signal.signal(signal.SIGPROF, fire)
    # Again every 5 ms: an exception raised where Python drops it (a finaliser, a weakref callback) is lost.
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.005)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def _equal_at_a_point(g, p) -> bool:
    """Whether two expressions in symbols are exactly equal (`numbers_equal`: proven or refused) at the first
    of `POINTS` where the reference is finite. `_differs_somewhere` cannot see a difference under 10^{-30},
    and math-verify compares with ``chop=True``: ``x + \\cos(10^{-20})`` passed for ``x + 1``."""
    symbols = sorted(g.free_symbols | p.free_symbols, key=str)
    for point in POINTS:
        values = {s: point[i % len(point)] + i for i, s in enumerate(symbols)}
        try:
            a = doit(g.subs(values))
            finite = a.is_finite
        except Exception:
            continue  # the reference cannot be evaluated here: the next point
        if finite:
            # What fails here (a number sympy cannot even print, x + \cos(10^{-4400})) raises: undecided,
            # scored 0. It used to be taken for a singular reference, and math-verify's chop passed it.
            return numbers_equal(a, doit(p.subs(values)), False)
    return True  # the reference is singular at every point: math-verify decides


def _kind(e) -> str:
    if isinstance(e, MatrixBase):
        return "matrix"
    if isinstance(e, SympyFiniteSet):
        return "finite"
    if isinstance(e, Tuple):
        return "tuple"
    if isinstance(e, sympy.Set):
        return "interval"  # Interval, Union, Complement, Reals...: sets of reals, not of listed values
    return "scalar"


def _ordered(e) -> list:
    """A list's elements in the order they were written (latex2sympy's FiniteSet keeps it)."""
    if isinstance(e, ParsedFiniteSet):
        return list(e._unsorted_args)
    return list(e.args)


def _match_all(gold: list, pred: list, decimal: bool) -> bool:
    """A one-to-one matching of the elements (sets: order does not matter)."""
    if len(gold) != len(pred):
        return False
    left = list(pred)
    for g in gold:
        for i, p in enumerate(left):
            if same(g, p, decimal):
                del left[i]
                break
        else:
            return False
    return True


def _relations_same(g, p) -> bool:
    """`same` for two relations not solved for one symbol, or a relation and something else."""
    if isinstance(g, Relational) and isinstance(p, Relational):
        if offset(g, p) or not proportional(g, p):
            return False  # math-verify would compare lhs - rhs with chop=True: y = 2x + 3 + 10^{-20} passed
        decided = polynomial_relations(g, p)
        if decided is not None:
            return decided
    return _math_verify(g, p)  # it solves both: seconds on x^2 + y^2 = (\sin x + \cos x)^{30}


def _relation_cpu_left() -> float:
    return RELATION_CPU - (time.process_time() - _request["cpu"])


def same(g, p, decimal: bool) -> bool:
    """`p` (the answer, decimals made exact) equals `g` (the reference) under the rules of the module docstring."""
    if is_equation(p) and not is_equation(g):
        p = take_last_relation(p).rhs  # "x = 5" answers 5
    elif is_assignment_relation(g) and not is_equation(p):
        g = take_last_relation(g).rhs  # the reference "x = 5" takes 5
    g, p = get_pct_val(g, g), get_pct_val(p, p)  # 50\% is 50, as in math-verify
    if is_relation(g) or is_relation(p):
        gs, ps = symbol_first(g), symbol_first(p)
        if not solved_for_one_symbol(gs, ps):
            # Solving one for the other's symbol expands the answer's sides (y (x+1)^{60} = (x+2)^{60}: 0.28 s).
            with cpu_budget(_relation_cpu_left()):
                gs, ps = solved_like(gs, ps)
        if solved_for_one_symbol(gs, ps):
            return same(gs.rhs, ps.rhs, decimal)  # y = f(x) and y = h(x): equivalent exactly where f equals h
        # The exact checks too within the request's `RELATION_CPU`: an answer such as x^2 = (\sin y + \cos x)^{30}
        # against y = 2x + 3 cost 0.05 s in them, cold, before math-verify was asked.
        with cpu_budget(_relation_cpu_left()):
            return _relations_same(g, p)
    kg, kp = _kind(g), _kind(p)
    if kg == "scalar" and kp in ("finite", "tuple") and len(p.args) == 1:
        p, kp = p.args[0], "scalar"
    if kg == "interval" or kp == "interval":
        if kg != kp:
            return False  # an interval is never its endpoints, a set of values never an interval
        if isinstance(g, Interval) and isinstance(p, Interval):
            return (g.left_open, g.right_open) == (p.left_open, p.right_open) and same(g.start, p.start, decimal) \
                and same(g.end, p.end, decimal)
        return _math_verify(g, p)  # unions and the like: set equality on exact ends
    if kg == "finite" and kp in ("finite", "tuple"):
        return _match_all(list(g.args), _ordered(p), decimal)
    if kg == "tuple" and kp in ("finite", "tuple"):
        gold, pred = list(g.args), _ordered(p)
        return len(gold) == len(pred) and all(same(a, b, decimal) for a, b in zip(gold, pred))
    if kg == "matrix" and kp == "matrix":
        return g.shape == p.shape and all(same(a, b, decimal) for a, b in zip(g, p))
    if kg != kp:
        return _math_verify(g, p)  # a column matrix against a tuple and the like: math-verify's rules
    if not (isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr)):
        return _math_verify(g, p)
    if is_number(g) or is_number(p):
        return is_number(g) and is_number(p) and numbers_equal(g, p, decimal)
    if _differs_somewhere(g, p) or not _equal_at_a_point(g, p):
        return False
    return _math_verify(g, p)


def _math_verify(g, p) -> bool:
    # No floats are left (`exact`), so float_rounding is never used; strict: variables matter.
    return bool(mv_verify(g, p, strict=True, timeout_seconds=None))


def _first_expr(parsed: list):
    return next((x for x in parsed if not isinstance(x, str)), None)


def _parsed(text: str, bare: bool) -> tuple[list, object]:
    """(math-verify's parse of `text`, its first sympy object or None): boxed, else in $...$ (a boxed
    percentage does not parse), else (an answer only) the bare text; after `math_forms.normalize`
    (``1\\,000``, ``3e-9``, ``0.\\overline{3}``, which math-verify misreads)."""
    text = normalize(text)
    if bare and malformed(text):
        return [], None  # an answer with a repeat mark no decimal reads as: equals nothing
    forms = ["\\boxed{" + text + "}", "$" + text + "$"] + ([text] if bare else [])
    first: list = []
    for form in forms:
        out = parse(form, parsing_timeout=None)
        first = first or out
        expr = _first_expr(out)
        if expr is not None:
            return out, expr
    return first, None


# Shapes whose parsing is paid once per worker, while it is idle, rather than by the first sample of each:
# the LaTeX parser (ANTLR) builds its prediction tables lazily, and the first bracket nested in another,
# the first nested exponent, the first interval... cost 0.03-0.16 s of CPU once, then a few ms.
WARM_UP = ("((x+1)+1)", "((x+1)*2)", "[(x+1)+1]", "\\{(x+1), 2\\}", "{{x}+1}", "[[x]+1]",
           "\\left(\\left(x\\right)^2\\right)", "\\sin(\\cos(x))", "f(g(x))", "x^{x^{2}}", "e^{(x+1)^2}",
           "2^{-x}", "\\sin^{2}(x)\\cos^{3}(x)", "(\\sin x + \\cos x)^{2}", "(1, 2)", "(2, 1)", "[1, 2)",
           "(0, 1) \\cup (2, \\infty)", "\\{1, 2\\}", "1, 2", "x = 1 \\text{ or } x = 2", "3 \\pm \\sqrt{2}",
           "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\frac{\\sqrt{3}}{2}", "x = 5", "y = 2x + 3", "x > 2",
           "1 < x \\le 2", "50\\%", "10,\\!080", "(x+1)(x+2)", "3\\times10^{-9}", "1.5", "\\text{(C)}",
           "x \\in [1, 2]", "\\sqrt[3]{x}", "|x - 1|", "\\cos(10^{-20})", "\\sqrt{1+10^{-20}}",
           "y = (\\sin x + \\cos x)^{2}", "x^2 + y^2 = (\\sin x + \\cos y)^{2}", "\\sin x = y",
           # A comparison, not a shape: the first one that reaches sympy's `simplify` imports sympy.physics
           # (0.5 s of CPU), which the first x + \\cos(10^{-20}) a worker saw paid.
           ("x+1", "x+\\cos(10^{-20})"),
           # Solving a relation linear in y (`math_relations.solved_like`): its first gcd cost 0.1 s.
           ("x y = 1", "y = \\frac{1}{x}"))


def warm_up(shape: str | tuple[str, str]) -> None:
    """Parse one shape of `WARM_UP`, or make one comparison of it (a worker does this while no request waits)."""
    try:
        if isinstance(shape, tuple):
            equal(*shape, 5.0)
        else:
            parse("\\boxed{" + shape + "}", parsing_timeout=None)
    except Exception:
        pass


REFERENCES = 1024  # parsed references a worker keeps (a GRPO group's samples share theirs; a dataset has thousands)


@lru_cache(maxsize=REFERENCES)
def parsed_reference(gold: str) -> tuple[tuple, object]:
    """(math-verify's parse of the reference `gold`, its first sympy object with decimals made exact, or None).

    Kept per distinct reference (least recently used first out). math-verify keeps only its last 20 parses,
    so a reference that comes back after other samples' (interleaved groups, bench_reward's order) was parsed
    again: about 45% of a worker's CPU per request there; consecutive samples of one group hit either cache.
    Only references are kept (trusted text, not a sample's answer), the objects are immutable sympy ones, and
    a parse that the request's alarm (or an error) interrupts raises through the cache and is not kept."""
    gold_parsed, g = _parsed(gold, bare=False)
    return tuple(gold_parsed), (exact(g)[0] if g is not None else None)


def equal(gold: str, pred: str, seconds: float) -> tuple[bool | None, str | None]:
    """(whether answer `pred` equals reference `gold`, why undecided or None); None on timeout or error."""
    g_letters = letters(gold)
    if g_letters is not None:
        return letters_equal(g_letters, pred), None
    try:
        with request_alarm(seconds):
            gold_parsed, g = parsed_reference(gold)
            # The budget counts from here: a reference is trusted text, parsed once per worker (up to 0.1 s cold).
            _request["cpu"] = time.process_time()
            pred_parsed, p = _parsed(pred, bare=True)
            if g is None:  # an unparsable reference: only the same text (math-verify's string comparison)
                return bool(gold_parsed and pred_parsed and mv_verify(list(gold_parsed), pred_parsed, timeout_seconds=None)), \
                    "reference not parsable"
            if p is None or (_kind(p) != "scalar" and _ZERO_GROUP.search(pred)):
                return False, None
            p, decimal = exact(p)
            return same(g, p, decimal), None
    except OverBudget:
        return None, "relation over its CPU budget"
    except OverTime:
        return None, "timeout"
    except Exception as exc:  # anything math-verify or sympy throws: undecided
        return None, f"{type(exc).__name__}: {exc}"[:300]
