"""Written forms of a number that math-verify misreads, rewritten before it parses an answer.

math-verify (and the LaTeX normalisation of latex2sympy2_extended under it) has no setting for
these forms, and each scored a right answer 0 (issue 58, round four):

- a thousands separator written as a space: ``1\\,000`` (SI style), ``1~000`` or ``1 000`` (LaTeX
  ignores that space), parsed as ``1*0``, i.e. 0, or not at all. Digit groups of three after one to
  three digits, joined by ``\\,``, ``\\;``, ``\\:``, ``\\ ``, ``~`` or a space, are joined (``1,000`` and
  ``1{,}000`` it already reads as 1000);
- scientific notation with a lowercase ``e``, ``3e-9``: parsed as ``3*E - 9`` (Euler's number).
  A decimal, ``e`` or ``E``, a signed exponent of at most three digits, standing alone (no letter,
  digit or point on either side), is written ``3\\times10^{-9}``: exact, where math-verify read
  ``3E-9`` as a 53-bit float;
- a repeating decimal, ``0.\\overline{3}`` or ``0.1\\overline{6}`` (``\\bar`` too), or with dots over the
  first and last repeating digits, ``0.\\dot{3}``, ``0.1\\dot{6}``, ``0.\\dot{1}4285\\dot{7}`` (British style):
  not parsed at all (the dots read as a product). It is written as the fraction it denotes, ``\\frac{1}{3}``;
  a decimal with a repeat mark that is not one of these (``0.\\overline{3}4``, ``0.\\dot{x}``) is `malformed`
  and an answer holding one equals nothing (math-verify read ``0.\\dot{3}4`` as 0 x 3 x 4);
- a signed exponent without braces, ``10^-9`` (LaTeX would raise only the sign): not parsed. It is
  written ``10^{-9}``.

`normalize` is applied to both the reference and the answer before parsing (math_compare), and to the
answer before the pre-parse budget (math_bounds), so the budget bounds what is parsed. None of these
forms occurs in the GSM8K or MATH-500 references.
"""

from __future__ import annotations

import re
from math import gcd

_SEPARATED = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\\[,;: ]|[~ ])\d{3})+(?!\d)")
_SPACE = re.compile(r"\\[,;: ]|[~ ]")
_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?|\.\d+)[eE]([+-]?)(\d{1,3})(?![\w.])")
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\(?:overline|bar)\s*(?:\{(\d{1,50})\}|(\d))(?![\d\\])")
_SIGNED_POWER = re.compile(r"\^\s*([+-]\d+)(?![\d.])")


def _fraction(m: re.Match) -> str:
    return _as_fraction(m[1] or "0", m[2], m[3] or m[4])


# Dots over the first and the last repeating digit (one dot: that digit repeats); nothing may follow.
_DOTTED = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\dot\s*(?:\{(\d)\}|(\d))(?:(\d{0,48})\\dot\s*(?:\{(\d)\}|(\d)))?(?![\d\\])")


def _dotted(m: re.Match) -> str:
    first, last = m[3] or m[4], m[6] or m[7]
    return _as_fraction(m[1] or "0", m[2], first + (m[5] + last if last else ""))


def _as_fraction(whole: str, fixed: str, repeat: str) -> str:
    """whole.fixed(repeat)(repeat)... as ``\\frac{p}{q}`` in lowest terms."""
    den = 10 ** len(fixed) * (10 ** len(repeat) - 1)
    num = int(whole) * den + int(fixed + repeat) - int(fixed or "0")
    g = gcd(num, den)
    return f"\\frac{{{num // g}}}{{{den // g}}}"


def normalize(text: str) -> str:
    """`text` with the forms of the module docstring rewritten (anything else unchanged)."""
    text = _SEPARATED.sub(lambda m: _SPACE.sub("", m[0]), text)
    if "\\" in text:
        text = _REPEATING.sub(_fraction, text)
        text = _DOTTED.sub(_dotted, text)
    if "e" in text or "E" in text:
        text = _SCIENTIFIC.sub(lambda m: f"{m[1]}\\times10^{{{m[2] if m[2] == '-' else ''}{m[3]}}}", text)
    if "^" in text:
        text = _SIGNED_POWER.sub(r"^{\1}", text)
    return text


# What is left of a repeating decimal `normalize` could not read (``0.\\overline{3}4``, ``0.\\dot{x}``): math-verify
# reads the mark as a product, ``0.\\dot{3}4`` as 0 x 3 x 4 (it equalled 0) and ``0.\\overline{3}4`` as 4/3.
_MALFORMED = re.compile(r"\d*\.\d*\s*\\(?:overline|bar|dot)(?![a-zA-Z])")


def malformed(text: str) -> bool:
    """Whether `text` (after `normalize`) still holds a decimal with a repeat mark: such an answer equals nothing."""
    return "\\" in text and _MALFORMED.search(text) is not None
