"""Two relations (equations, inequalities) compared without math-verify where that can be done exactly and cheaply.

`math_compare.same` asks these before math-verify's comparison, which solves both relations (seconds of a worker's
CPU on ``x^2 + y^2 = (\\sin x + \\cos x)^{30}``): equations solved for one symbol are compared by their right sides,
relations whose sides differ by a non-zero constant or (between polynomials) are not proportional are refused, and
two relations between polynomials are decided here.
"""

from __future__ import annotations

import sympy
from sympy import Rational
from sympy.core.relational import Relational

from mentor.training.math_numbers import DIGITS, POINTS, doit, is_number, numbers_equal

def proportional(g: Relational, p: Relational) -> bool:
    """Whether lhs - rhs of two relations could be proportional (equivalent up to a constant factor): their
    ratio at `POINTS` is one constant. Only where both are polynomials (lines, planes, conics: there
    this is what equivalence means); any other pair is left to math-verify (True here)."""
    try:
        dg, dp = g.lhs - g.rhs, p.lhs - p.rhs  # x \\in [-2, 7] is Eq(x, Interval): no difference
        symbols = sorted(dg.free_symbols | dp.free_symbols, key=str)
        if not (symbols and dg.is_polynomial(*symbols) and dp.is_polynomial(*symbols)):
            return True
    except Exception:
        return True
    ratios = []
    for point in POINTS:
        values = {s: point[i % len(point)] + i for i, s in enumerate(symbols)}
        a, b = doit(dg.subs(values)), doit(dp.subs(values))
        if a == 0 or b == 0:
            if a != b:
                return False
            continue
        r = a / b
        if not ratios:
            pass
        elif r.is_Rational and ratios[0].is_Rational:
            if r != ratios[0]:
                return False
        elif abs((r - ratios[0]).evalf(DIGITS)) > Rational(1, 10**30) * abs(ratios[0].evalf(DIGITS)):
            return False
        ratios.append(r)
    # Within 10^{-30} at every point: the first two ratios proven equal or refused (y = 2x + 2 + \cos(10^{-20})).
    return len(ratios) < 2 or numbers_equal(ratios[0], ratios[1], False)


def solved_for_one_symbol(g, p) -> bool:
    """Whether both are equations ``y = ...`` solved for the same symbol (absent from both right sides).
    They are then compared as their right sides, expressions: math-verify would solve both, which cost
    a worker 2 s and more on ``y = (\\sin x + \\cos x)^{30}`` against ``y = 2x + 3`` (issue 58)."""
    if not (isinstance(g, sympy.Eq) and isinstance(p, sympy.Eq) and isinstance(g.lhs, sympy.Symbol) and g.lhs == p.lhs):
        return False
    try:
        return g.lhs not in g.rhs.free_symbols | p.rhs.free_symbols
    except Exception:
        return False


def symbol_first(e):
    """``\\sin x = y`` as ``y = \\sin x``: an equation whose right side alone is a symbol, turned round."""
    if isinstance(e, sympy.Eq) and isinstance(e.rhs, sympy.Symbol) and not isinstance(e.lhs, sympy.Symbol):
        return sympy.Eq(e.rhs, e.lhs, evaluate=False)
    return e


def solved_like(g, p) -> tuple:
    """(g, p) with each equation solved for one symbol first (`symbol_first`), and where one is solved for a symbol
    ``y`` and the other is linear in ``y`` (``xy = 1`` for ``y = \\frac{1}{x}``), the other solved for it too: a
    linear equation has that one solution, so the two are then compared by right sides (math-verify would solve
    both under `math_compare.RELATION_CPU`). A relation of higher degree in ``y`` (``x^2 + y^2 = 25``) is left as
    it is: ``y = \\sqrt{25 - x^2}`` is one branch of it, not it."""
    g, p = symbol_first(g), symbol_first(p)
    for a, b in ((g, p), (p, g)):
        if isinstance(a, sympy.Eq) and isinstance(a.lhs, sympy.Symbol) and isinstance(b, sympy.Eq) \
                and not (isinstance(b.lhs, sympy.Symbol) and b.lhs == a.lhs):
            solved = _solve_linear(b, a.lhs)
            if solved is not None:
                return (a, solved) if a is g else (solved, a)
    return g, p


def _solve_linear(e: sympy.Eq, y: sympy.Symbol):
    """``y = -c0 / c1`` for an equation c1·y + c0 = 0 that this solution is all of, else None: c1 and c0 hold no y,
    and are numbers or polynomials in one other symbol with no common root (``x y = 5 y`` is x = 5 or y = 0)."""
    try:
        d = sympy.expand(e.lhs - e.rhs)
        c1, c0 = d.coeff(y, 1), d.coeff(y, 0)
        others = (c1.free_symbols | c0.free_symbols) - {y}
        if c1 == 0 or y in c1.free_symbols | c0.free_symbols or sympy.expand(c1 * y + c0 - d) != 0 or len(others) > 1:
            return None
        if others:
            (x,) = others
            if not (c1.is_polynomial(x) and c0.is_polynomial(x)) or sympy.degree(sympy.gcd(c1, c0), x) > 0:
                return None
        return sympy.Eq(y, -c0 / c1, evaluate=False)
    except Exception:
        return None


def offset(g: Relational, p: Relational) -> bool:
    """Whether lhs - rhs of two relations differ by a non-zero constant, either sign (then they are not equivalent:
    level sets of one function at two levels). `proportional` sees this between polynomials only; math-verify's
    chop passed ``y = \\sin x + 10^{-20}`` for ``y = \\sin x`` (the constant is proven non-zero or refused)."""
    try:
        dg, dp = g.lhs - g.rhs, p.lhs - p.rhs
    except Exception:
        return False
    for d in (dg - dp, dg + dp):
        try:
            c = doit(sympy.expand(d, multinomial=False))  # (x+1)^{200} is not expanded: 0.1 s
            if is_number(c) and c != 0 and not numbers_equal(c, sympy.Integer(0), False):
                return True
        except Exception:
            continue
    return False


_FLIPPED = {sympy.StrictLessThan: sympy.StrictGreaterThan, sympy.StrictGreaterThan: sympy.StrictLessThan,
            sympy.LessThan: sympy.GreaterThan, sympy.GreaterThan: sympy.LessThan}


def polynomial_relations(g: Relational, p: Relational) -> bool | None:
    """Two relations whose sides are polynomials, decided here (None for any other pair): equal exactly when
    p's lhs - rhs is c times g's for a non-zero number c, c > 0 for the same inequality, c < 0 for the flipped
    one (``x > 2`` and ``-x < -2``); every coefficient compared exactly (`numbers_equal`). That is what
    `proportional` already requires of them; math-verify's solve is then never reached for them (it cost
    0.01-0.1 s a pair, more on a busy worker)."""
    try:
        dg, dp = g.lhs - g.rhs, p.lhs - p.rhs
        symbols = sorted(dg.free_symbols | dp.free_symbols, key=str)
        if not (symbols and dg.is_polynomial(*symbols) and dp.is_polynomial(*symbols)):
            return None
        pg, pp = sympy.Poly(dg, *symbols), sympy.Poly(dp, *symbols)
    except Exception:
        return None
    if type(g) is type(p):
        sign = 0 if isinstance(g, (sympy.Eq, sympy.Ne)) else 1  # x != 2 is -x != -2 too
    elif _FLIPPED.get(type(g)) is type(p):
        sign = -1
    else:
        return False  # an equation is never an inequality, < never <=
    terms_g, terms_p = dict(pg.terms()), dict(pp.terms())
    if not terms_g or set(terms_g) != set(terms_p):
        return False
    first = next(iter(terms_g))
    c = doit(terms_p[first] / terms_g[first])
    if sign and not (c.is_positive if sign > 0 else c.is_negative):
        return False
    return all(numbers_equal(c * a, terms_p[m], False) for m, a in terms_g.items())
