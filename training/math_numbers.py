"""Numbers (sympy expressions without free symbols) compared exactly, for `math_compare` and `math_relations`.

A decimal is read as the rational its digits write (`exact`); two numbers are equal when exactly equal, or for a
decimal answer to a reference no decimal can write, within a relative `TOLERANCE` (so 0 never matches a non-zero
reference); a difference under 10^{-30} is proven or refused by sympy, never chopped (issue 58).
"""

from __future__ import annotations

import sympy
from sympy import Float, Rational, Tuple

TOLERANCE = Rational(1, 10**6)  # relative, for a decimal answer to a reference no decimal can write
POINTS = ((Rational(7, 5), Rational(13, 7), Rational(31, 11)), (Rational(17, 6), Rational(5, 13), Rational(23, 9)),
           (Rational(41, 19), Rational(11, 3), Rational(3, 29)))  # where expressions in symbols are evaluated
DIGITS = 50  # evalf precision of those checks


def exact(expr):
    """(`expr` with each float replaced by the rational its digits write, whether it had one)."""
    try:
        floats = [f for f in expr.atoms(Float) if f.is_finite]
    except Exception:
        return expr, False
    if not floats:
        return expr, False
    return expr.xreplace({f: Rational(str(f)) for f in floats}), True


def _terminating(q: Rational) -> bool:
    """Whether a decimal can write the rational `q` (its denominator has no prime but 2 and 5)."""
    d = int(q.q)
    d >>= (d & -d).bit_length() - 1
    while d % 5 == 0:
        d //= 5
    return d == 1


def is_number(e) -> bool:
    return isinstance(e, sympy.Expr) and not isinstance(e, (sympy.Set, Tuple)) and not e.free_symbols


def _close(g, p) -> bool:
    """|p - g| <= TOLERANCE * |g|, evaluated to `DIGITS` digits; a zero reference needs exactly 0."""
    if g == 0:
        return p == 0
    gv, pv = g.evalf(DIGITS), p.evalf(DIGITS)
    return bool(abs(pv - gv) <= TOLERANCE * abs(gv))


def numbers_equal(g, p, decimal: bool) -> bool:
    """Two numbers (no free symbols): exactly equal, or for a decimal answer (`decimal`) to a reference
    no decimal can write, within a relative `TOLERANCE`."""
    g, p = doit(g), doit(p)
    if g == p:
        return True
    if not (g.is_finite and p.is_finite):
        return False  # oo, -oo, zoo, nan: only themselves
    if g.is_Rational and p.is_Rational:
        return decimal and not _terminating(g) and _close(g, p)
    if decimal and not (g.is_Rational and _terminating(g)):
        return _close(g, p)
    gv, pv = g.evalf(DIGITS), p.evalf(DIGITS)
    if not (gv.is_number and pv.is_number):
        return False
    if abs(gv - pv) > Rational(1, 10**30) * (abs(gv) + abs(pv)):
        return False  # decisively different at 50 digits
    d = g - p  # equal to 30 digits: proven or refused exactly (radicals rationalized first: a tenth of simplify's cost)
    return sympy.expand(sympy.radsimp(d)) == 0 or sympy.simplify(d) == 0


def doit(e):
    try:
        return e.doit()
    except Exception:
        return e
