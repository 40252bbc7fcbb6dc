"""The hint rules, each declared once with `rule` (`RuleRegistry.add`), and the functions that run them.

The order of the declarations is the order the rules run in and the order of a
hint's violations. Cheap substring tests gate the regexes: most hints trigger
none of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mentor.stages.rules.arithmetic import expression_leak
from mentor.stages.rules.bare_answer import answer_only
from mentor.stages.rules.context import (
    SENT_END,
    WORD,
    RuleContext,
    RuleLimits,
    data_numbers,
    english_ratio,
    latin_ratio,
    normalise_hint,
    sentence_count,
)
from mentor.stages.rules.numbers import HAS_DIGIT, AnswerMatcher
from mentor.stages.rules.registry import RuleRegistry
from mentor.stages.rules.words import number_word_leak

rule = RuleRegistry.add

_ALNUM = re.compile(r"[^\W_]")


@rule("empty", "the hint is empty", alone=True)
def empty(text: str, ctx: RuleContext) -> bool:
    """Nothing but whitespace / punctuation."""
    return not _ALNUM.search(text)


@rule("too_long", "the hint is too long: one to three short sentences", trimmable=True)
def too_long(text: str, ctx: RuleContext) -> bool:
    """More characters or sentences than `RuleLimits` allows."""
    return len(text) > ctx.limits.max_chars or sentence_count(text) > ctx.limits.max_sentences


def indirect_leak(text: str, matcher: AnswerMatcher) -> bool:
    """`expression_leak` or `number_word_leak`: the answer computed or spelled out."""
    return expression_leak(text, matcher) or number_word_leak(text, matcher)


@rule("answer_leak", "the hint reveals the final answer (in some form); remove every trace of it", trimmable=True)
def text_leaks_answer(text: str, ctx: RuleContext) -> bool:
    """The reference answer in any equivalent form (``\\frac{14}{3}``, ``14/3``, ``4.666…``, ``4 2/3``, ``4.67``
    as a rounding, a boxed or "$...$" form, ...), as arithmetic that evaluates to it (``2*9``) or in number words
    (``eighteen``). The hint stage screens the attribution's keywords with it too."""
    return ctx.matcher.leaks(text) or indirect_leak(text, ctx.matcher)


@rule("answer_only", "the hint is only an answer (a bare value or 'A: ...'); give a direction in words instead",
      trimmable=True, domain="math")
def only_an_answer(text: str, ctx: RuleContext) -> bool:
    """Only an answer line or a bare value (``A: 66``, ``66``), see `answer_only`."""
    return answer_only(text)


_FINAL = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?(?:answer|result|solution)\s*(?:is|=|:|would\s+be|should\s+be|will\s+be|equals)\b"
    r"|\\boxed|####|\bfinal\s+answer\b",
    re.I,
)


@rule("final_answer_line", "the hint states a final answer ('the answer is', boxed); point a direction instead",
      trimmable=True)
def final_answer_line(text: str, ctx: RuleContext) -> bool:
    """"The answer is ...", ``\\boxed{}``, ``####``."""
    low = text.lower()
    return ("answer" in low or "result" in low or "solution" in low or "boxed" in low or "####" in text) and bool(
        _FINAL.search(text)
    )


_STEP = re.compile(r"(?im)\bstep\s*\d+|^\s*\d+[.)]\s")
_EQUALS = re.compile(r"(?<![<>!=])=(?!=)")


@rule("full_solution", "the hint works out the solution step by step; give only the key idea", trimmable=True)
def full_solution(text: str, ctx: RuleContext) -> bool:
    """A worked solution: more equations or numbered steps than `RuleLimits` allows."""
    lim = ctx.limits
    return (text.count("=") > lim.max_equations and len(_EQUALS.findall(text)) > lim.max_equations) or (
        ("step" in text.lower() or "\n" in text) and len(_STEP.findall(text)) > lim.max_steps
    )


@rule("restates_problem", "the hint only restates the problem; name the idea the solver is missing")
def restates_problem(text: str, ctx: RuleContext) -> bool:
    """The hint mostly copies the problem text."""
    if not ctx.problem:
        return False
    words = WORD.findall(text.lower())
    if len(words) < 6:
        return False
    # Cheap probe first: a hint that copies the problem shares word triples with it at its start,
    # middle or end; a hint with none of those three in the problem is not a restatement.
    joined = ctx.problem_joined
    n = len(words)
    if not any(" ".join(words[i : i + 3]) in joined for i in (0, n // 2 - 1, n - 3)):
        return False
    pw = ctx.problem_words
    if sum(1 for w in words if w in pw) < 0.8 * len(words):
        return False
    grams = list(zip(words, words[1:], words[2:]))
    pt = ctx.problem_trigrams
    return sum(1 for g in grams if g in pt) >= 0.8 * len(grams)


_OPERATION = re.compile(r"=|\d\s*%?\s*[-+*/×÷x]\s*\$?\d|\\(?:times|cdot|div|frac)")
# An operation said in words ("Subtract the 3 eaten and the 4 baked from the 16 laid") relates the numbers as
# much as "16 - 3 - 4" does.
_OPERATION_WORDS = re.compile(
    r"\b(?:subtract\w*|minus|plus|add(?:s|ed|ing)?|multipl\w*|divid\w*|sum|difference|product|quotient|"
    r"ratio|twice|triple|double|halve|take\w*\s+away|deduct\w*|combine\w*)\b",
    re.I,
)


def _operation_in_words(hint: str, ctx: RuleContext) -> bool:
    """An operation word in the hint that the problem does not use itself (copied from the problem, it restates)."""
    return any(m.group(0).split()[0].lower() not in ctx.problem_words for m in _OPERATION_WORDS.finditer(hint))


@rule("restates_numbers", "the hint repeats the problem's numbers; name the relation or first step instead of the data",
      trimmable=True, unless="restates_problem")
def restates_numbers(text: str, ctx: RuleContext) -> bool:
    """The hint lists the problem's data and nothing else: three or more of its numbers (digits or number
    words; 0, 1 and 2 not counted), at least 60% of them, no number of its own and no operation or equation
    relating them (in symbols, or in words the problem does not use itself: "subtract", "the difference", ...)."""
    if not ctx.problem or not HAS_DIGIT.search(text):
        return False
    given = ctx.problem_numbers
    if len(given) < 3:
        return False
    mine = data_numbers(text)
    shared = len(given & mine)
    # A hint that derives a quantity of its own ("16 - 3 - 4 = 9 eggs are sold") or relates the data in an
    # operation or equation ("X - X*25% = $19.50") works with the data; one that only lists it restates it.
    return (shared >= 3 and shared >= 0.6 * len(given) and mine <= given and not _OPERATION.search(text)
            and not _operation_in_words(text, ctx))


_LEAD_IN = re.compile(
    r"^(?:here(?:'s| is| are)|let(?:'s| us| me)|below is|the following|follow these|to solve (?:this|it)|"
    r"i will|we will|we can)\b[^.!?]{0,80}$",
    re.I,
)


@rule("list_header", "the hint is only a lead-in ('Here is the breakdown:'); write the hint itself")
def list_header(text: str, ctx: RuleContext) -> bool:
    """A lead-in that promises content and stops: ends with a colon, or a bare 'Here's ...' / 'Let's ...' phrase
    ("Here's the step-by-step breakdown:", "Let's solve it:")."""
    t = text.strip().rstrip("*_ ")
    if t.endswith((":", "：")):
        return True
    words = t.split()
    return len(words) <= 10 and bool(_LEAD_IN.match(t.rstrip(".!")))


# A first word in lowercase letters, followed by a space or punctuation (not "x", "gcd(", "don't", "x-axis").
_LOWER_FIRST = re.compile(r"([a-z]{2,})(?=[\s,;:!?]|\.(?:\s|$)|$)")


@rule("starts_mid_sentence",
      "the hint starts mid-sentence; write it as whole sentences that begin with a capital letter")
def starts_mid_sentence(text: str, ctx: RuleContext) -> bool:
    """A hint that opens in the middle of a sentence: the 1.5B hinter sometimes stops its JSON "reasoning"
    mid-sentence and goes on in "hint" ("...the time it takes to" / "cook the chicken. Since ...").
    In code a lowercase first word that the problem uses is an identifier ("nums may be empty")."""
    if not "a" <= text[:1] <= "z":
        return False
    m = _LOWER_FIRST.match(text)
    if m is None:
        return False
    return not (ctx.domain == "code" and re.search(r"\b" + m.group(1) + r"\b", ctx.problem))


# 10 words: no GSM8K reference first step repeats a run that long, 4 of 1,319 first halves of a solution do;
# 6 caught honest hints that name a quantity twice ("the total number of days ... the total number of days").
REPEAT_NGRAM = 10


@rule("repeats_itself", "the hint says the same thing twice; say each step once", trimmable=True)
def repeats_itself(text: str, ctx: RuleContext) -> bool:
    """The same run of REPEAT_NGRAM words twice: a small hinter that loops ("calculate the number of classes each
    day ... then calculate the number of classes each day ..."). Trimming keeps the sentences before the repeat."""
    words = WORD.findall(text.lower())
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - REPEAT_NGRAM + 1):
        gram = tuple(words[i : i + REPEAT_NGRAM])
        if gram in seen:
            return True
        seen.add(gram)
    return False


# The agents see the reference answer and rejected hints; the solver sees neither.
_PIPELINE = re.compile(r"\b(reference (answer|solution)|(rejected|previous|earlier|original) hint)\b", re.I)


@rule("mentions_pipeline", "the hint talks about the reference answer or an earlier hint, which the solver never "
      "sees; address the problem itself", trimmable=True)
def mentions_pipeline(text: str, ctx: RuleContext) -> bool:
    """The reference answer or an earlier hint, which the solver never sees."""
    low = text.lower()
    return ("reference" in low or "hint" in low) and bool(_PIPELINE.search(text))


_CODE_FENCE = re.compile(r"```")


@rule("solution_code", "the hint contains the solution code; describe the approach in words", domain="code")
def solution_code(text: str, ctx: RuleContext) -> bool:
    """A function defining the entry point, or a fenced function / return."""
    return bool((ctx.entry_def is not None and ctx.entry_def.search(text))
                or (_CODE_FENCE.search(text) and re.search(r"\bdef\s+\w+\s*\(|\breturn\b", text)))


@rule("repeats_previous_hint", "the hint repeats an earlier hint; go one step further")
def repeats_previous_hint(text: str, ctx: RuleContext) -> bool:
    """Identical (in lowercase words) to a hint of an earlier round."""
    return bool(ctx.previous_normalised) and normalise_hint(text) in ctx.previous_normalised


@rule("wrong_language", "the hint is not in the language of the problem")
def wrong_language(text: str, ctx: RuleContext) -> bool:
    """Mostly non-Latin script for a Latin-script problem, or a Latin-script hint for an English problem that
    uses almost no English function words."""
    # The hint's own tests first: the problem's script/language is computed only when they fire.
    if not text.isascii() and latin_ratio(text) < 0.7 and ctx.latin_problem:
        return True
    n, ratio = english_ratio(text)
    return n >= 10 and ratio < 0.1 and ctx.english_problem and ctx.latin_problem


# --------------------------------------------------------------------------- running the rules


def check_hint(hint: str, ctx: RuleContext) -> list[str]:
    """The names of every rule `hint` violates, in the rules' order (empty list: it passes)."""
    text = hint.strip() if hint else ""
    out: list[str] = []
    for r in RuleRegistry.rules(ctx.domain):
        if r.unless is not None and r.unless in out:
            continue
        if r.check(text, ctx):
            if r.alone:
                return [r.name]
            out.append(r.name)
    return out


# A rambling model writes a good first sentence and then the whole solution: the rules reject the
# hint for what comes after. The trimmable violations are those that dropping trailing sentences can cure.
MIN_TRIMMED_WORDS = 8


def trim_to_rules(hint: str, ctx: RuleContext, violations: Sequence[str]) -> str | None:
    """The longest run of `hint`'s leading whole sentences that passes every rule, or None.

    Only for hints rejected for trimmable reasons alone (a restated problem or solution code is not cured
    by cutting), and only when the kept part has at least MIN_TRIMMED_WORDS words.
    """
    if not violations or not set(violations) <= RuleRegistry.trimmable():
        return None
    text = hint.strip()
    ends = [m.end() for m in SENT_END.finditer(text)]
    for end in reversed(ends):
        head = text[:end].strip()
        if head == text or len(WORD.findall(head.lower())) < MIN_TRIMMED_WORDS:
            continue
        if not check_hint(head, ctx):
            return head
    return None


@dataclass
class RuleReport:
    ok: bool
    violations: list[str]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "violations": self.violations}


def check(
    hint: str,
    domain: str = "math",
    answer: str | None = None,
    problem: str = "",
    previous_hints: tuple[str, ...] | list[str] = (),
    entry_point: str | None = None,
    limits: RuleLimits | None = None,
    control_tokens: Sequence[str] | None = None,
) -> RuleReport:
    """Run the rules on one hint (the `mentor check-hint` entry point); `control_tokens`: the chat-control tokens
    of the known tokenizers (`special_tokens.control_tokens`), default the built-in list."""
    ctx = RuleContext(
        domain=domain,
        answer=answer,
        problem=problem or "",
        previous_hints=tuple(previous_hints),
        limits=limits or RuleLimits(),
        entry_point=entry_point,
        control_tokens=tuple(control_tokens) if control_tokens is not None else None,
    )
    v = check_hint(hint, ctx)
    return RuleReport(ok=not v, violations=v)
