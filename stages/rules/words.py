"""Numbers written in English words (``eighteen``, ``one hundred and five``, ``three quarters``,
``18 thousand``, ``fifteen percent``) and `number_word_leak`: the answer spelled out.

Single words for 0, 1 and 2 ("one of them", "the two cases") are too common in
honest hints to count as the answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mentor.stages.rules.numbers import AnswerMatcher

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
NUMBER_WORD_GATE = frozenset(set(_UNITS) | set(_TENS) | set(_SCALES) | set(_FRACTION_WORDS) | {"hundred", "dozen"})
LETTERS = re.compile(r"[a-z]+")


@dataclass(frozen=True, slots=True)
class WordNumber:
    start: int
    end: int
    value: Fraction  # "fifteen percent": 15, with percent=True (it leaks 15 and 0.15, like "15%")
    words: int  # how many number words make it up (a lone "one" is 1)
    percent: bool = False


def number_words(text: str) -> list[WordNumber]:
    """Every number written in English words in `text`, with its exact value and span."""
    if NUMBER_WORD_GATE.isdisjoint(LETTERS.findall(text.lower())):
        return []
    toks = [(m.group(0).lower(), m.start(), m.end()) for m in _WORD_TOKEN.finditer(text)]
    out: list[WordNumber] = []
    i = 0
    while i < len(toks):
        w = toks[i][0]
        found = _parse_number_words(toks, i) if w in _NUMBER_VOCAB or w[0].isdigit() else None
        if found is None:
            i += 1
            continue
        j, value, words = found
        pct = toks[j - 1][0] == "percent"
        out.append(WordNumber(toks[i][1], toks[j - 1][2], value, words - pct, pct))
        i = j
    return out


# Number words that alone never count as the answer (see number_word_leak); a text whose only
# number words are these cannot spell the answer, and is not parsed at all.
SMALL_WORDS = frozenset({"zero", "one", "two"})


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


def number_word_leak(text: str, matcher: AnswerMatcher) -> bool:
    """Whether `text` writes a numeric answer in words."""
    if matcher.value is None:
        return False
    target = abs(matcher.value)
    present = NUMBER_WORD_GATE.intersection(LETTERS.findall(text.lower()))
    if present <= SMALL_WORDS:
        return False
    for n in number_words(text):
        if n.words == 1 and n.value <= 2:
            continue  # "one of them", "the two sides": not the answer
        if n.value == target or (n.percent and n.value / 100 == target):
            return True
    return False
