"""`answer_only`: a hint that is only an answer line or a bare value (``A: 66``, ``66``,
``$\\frac{1}{2}$``), whatever the value: a wrong final answer is no hint either."""

from __future__ import annotations

import re

from mentor.stages.rules.numbers import HAS_DIGIT
from mentor.stages.rules.words import number_words

_ANSWER_LABEL = re.compile(
    r"^\s*(?:\*\*|__)?\s*(?:(?:the\s+)?final\s+answer|answer|ans|a|result|solution|sol|output)\s*(?:\*\*|__)?\s*[:=]\s*", re.I
)
_HINT_LABEL = re.compile(r"^\s*(?:\*\*|__)?\s*hint\s*(?:\*\*|__)?\s*[:=]\s*", re.I)
_WRAPPERS = re.compile(r"\\boxed\s*\{|\\\(|\\\)|\\\[|\\\]|\$|\*\*|__|`")
_BARE_VALUE = re.compile(
    r"[-+]?\s*(?:\\\$|\$|€|£)?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|\\%)?"  # 66, $1,200, 12.5%, .5
    r"|[-+]?\s*\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}"  # \frac{1}{2}
    r"|[-+]?\s*\d+\s*/\s*\d+"  # 1/2
)
_VARIABLE_IS = re.compile(r"[A-Za-z]\s*=\s*(.+)")  # x = 5 (a value, not "x = the number of eggs")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_LATEX_NAMES = re.compile(r"\\(?:begin|end)\s*\{[A-Za-z*]*\}?|\\[A-Za-z]+")  # \begin{pmatrix}, \frac: not prose
_LEADING_VALUE = re.compile(r"[-+]?\s*(?:\\\$|\$|€|£)?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|\\%)?")


_THREE_WORDS = re.compile(r"[A-Za-z]{3,}[^A-Za-z\d]+[A-Za-z]{3,}[^A-Za-z\d]+[A-Za-z]{3,}")


def answer_only(text: str) -> bool:
    """Whether the hint is only an answer: ``A: 66``, ``Answer: twelve``, ``66``, ``$\\frac{1}{2}$``, ``x = 5``,
    ``66 dollars``, ``Eighteen``, or arithmetic with no words around it."""
    t = text.strip()
    h = _HINT_LABEL.match(t)
    if h:
        t = t[h.end():]  # "Hint: ..." is judged by what follows
    m = _ANSWER_LABEL.match(t)
    if not m and _THREE_WORDS.search(t):
        return False  # prose: the usual case, decided without the checks below
    body = t[m.end():] if m else t
    body = _WRAPPERS.sub(" ", body).replace("}", " ").strip().rstrip(".!;,").strip()
    if not body:
        return bool(m)
    words = _PROSE_WORD.findall(_LATEX_NAMES.sub(" ", body))
    if m and (len(body.split()) <= 4 or not words):
        return True  # "A: 66", "Answer: 12 apples": an answer line, not a direction
    spelled = number_words(body)
    if len(spelled) == 1 and len((body[: spelled[0].start] + body[spelled[0].end :]).split()) <= 2:
        return True  # "Eighteen", "twelve apples"
    if not HAS_DIGIT.search(body):
        return False
    head = _LEADING_VALUE.match(body)
    if head and head.end() > 0 and len(body[head.end():].split()) <= 2:
        return True  # "66", "66 dollars", "$1,200 in total"
    if _BARE_VALUE.fullmatch(body):
        return True
    var = _VARIABLE_IS.fullmatch(body)
    if var and not _PROSE_WORD.search(var.group(1)):
        return True
    return not words  # "2*9", "3^3 + 1": arithmetic with no prose at all
