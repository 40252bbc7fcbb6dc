"""Output that parrots an agent's own instructions (the attribution's keywords and errors), not a hint rule."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mentor.stages.rules.context import WORD


@dataclass(frozen=True)
class Instructions:
    """An agent's own instructions (its templates, placeholders removed), to spot output that parrots them."""

    joined: str  # words, single-spaced, with spaces at both ends
    grams: frozenset

    @classmethod
    def of(cls, *texts: str) -> Instructions:
        w = WORD.findall(_PLACEHOLDER_RE.sub(" ", " ".join(texts).lower()))
        return cls(" " + " ".join(w) + " ", frozenset(zip(w, w[1:], w[2:])))


_PLACEHOLDER_RE = re.compile(r"\{\{\s*\w+\s*\}\}")


def copies_instructions(text: str, instructions: Instructions, problem: str = "") -> bool:
    """Whether `text` (an attributed error or keyword) repeats the instructions rather than analysing the attempts.

    Half or more of its word triples come from the instructions and not from
    the problem; a text of one or two words when it is a phrase of the
    instructions that the problem does not use ("failed attempts").
    """
    w = WORD.findall(text.lower())
    if not w:
        return False
    pw = WORD.findall(problem.lower())
    if len(w) < 3:
        phrase = " " + " ".join(w) + " "
        return phrase in instructions.joined and phrase not in " " + " ".join(pw) + " "
    pgrams = set(zip(pw, pw[1:], pw[2:]))
    mine = list(zip(w, w[1:], w[2:]))
    return sum(1 for g in mine if g in instructions.grams and g not in pgrams) >= 0.5 * len(mine)
