"""The leak guard's indirect checks on the real GSM8K / MATH-500 answers: arithmetic that evaluates to
the answer, the answer in number words, and hints that are only an answer -- and honest hints that pass."""

from __future__ import annotations

import json
import re
import time

import polars as pl
import pytest

from conftest import SHARED_DATA
from mentor.stages.rules import check

UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def words(n: int, british: bool = False) -> str:
    """English words for 0 <= n < 10**9 (written independently of the code under test)."""
    if n < 20:
        return UNITS[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + UNITS[n % 10])
    if n < 1000:
        rest = n % 100
        return UNITS[n // 100] + " hundred" + ("" if rest == 0 else (" and " if british else " ") + words(rest, british))
    for size, name in ((10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return words(n // size, british) + " " + name + ("" if rest == 0 else " " + words(rest, british))
    raise ValueError(n)


def _v(hint: str, answer: str) -> list[str]:
    return check(hint, "math", answer).violations


@pytest.fixture(scope="module")
def gsm8k() -> list[dict]:
    from mentor.data import bundled

    return pl.read_parquet(bundled("gsm8k_problems.parquet")).to_dicts()


@pytest.fixture(scope="module")
def math500() -> list[dict]:
    from mentor.data import bundled

    return pl.read_parquet(bundled("math500_problems.parquet")).to_dicts()


def test_every_gsm8k_answer_in_words_leaks(gsm8k):
    checked = 0
    for row in gsm8k:
        n = int(row["label"].replace(",", ""))
        if not 3 <= n < 10**9:
            continue
        for text in {words(n), words(n, british=True)}:
            assert "answer_leak" in _v(f"Altogether that makes {text} in the end.", row["label"]), (text, n)
        checked += 1
    assert checked > 1200


def test_every_composite_gsm8k_answer_as_a_product_or_power_leaks(gsm8k):
    checked = 0
    for row in gsm8k:
        n = int(row["label"].replace(",", ""))
        a = next((d for d in range(2, int(n**0.5) + 1) if n % d == 0), None) if n > 3 else None
        if a is None:
            continue
        b = n // a
        for hint in (f"Multiply to get {a}*{b}.", f"Work out ${a} \\times {b}$ first.", f"It is {a}({b}) dollars.",
                     f"Compute ({a} x {b}) carefully."):
            assert "answer_leak" in _v(hint, row["label"]), hint
        root = round(n ** 0.5)
        if root * root == n:
            assert "answer_leak" in _v(f"Take $\\sqrt{{{n * n}}}$ and go on.", row["label"])
            assert "answer_leak" in _v(f"So {root}^2 is what you need.", row["label"])
        checked += 1
    assert checked > 1000


def test_gsm8k_partial_computations_pass(gsm8k):
    """A hint may set up a step with the problem's own numbers, as long as it does not compute the answer."""
    checked = 0
    for row in gsm8k[:400]:
        n = int(row["label"].replace(",", ""))
        nums = [int(x) for x in re.findall(r"(?<![\d.,$])\d+(?![\d,.]\d)", row["problem"])]
        pairs = [(a, b) for a in nums for b in nums if a != b and a - b > 0 and a - b != n and a + b != n and a * b != n
                 and n not in (a, b) and 0 < abs(a - b) and abs(a - b) != n]
        if not pairs:
            continue
        a, b = pairs[0]
        hint = f"First find how much is left: {a} - {b}, then decide what the question asks for."
        assert _v(hint, row["label"]) == [], (hint, row["label"])
        checked += 1
    assert checked > 150


def test_every_math500_answer_as_an_answer_line_is_answer_only(math500):
    missed = [r["label"] for r in math500 if "answer_only" not in _v(f"A: {r['label']}", r["label"])]
    assert missed == []
    # ... and a wrong value given as the hint is no hint either (A: 66 for 18 was accepted as "repaired").
    assert "answer_only" in _v("A: 66", "18") and "answer_only" in _v("66", "18") and "answer_only" in _v("Answer: 12 apples", "18")


@pytest.mark.skipif(not (SHARED_DATA / "math500" / "test.jsonl").exists(), reason="real data")
def test_first_steps_of_real_solutions_rarely_trip_the_new_checks():
    """The first sentence of each real MATH-500 solution is hint-like text written by people. Of those the
    older checks let through, the new checks flag only a few: each is a computation of the answer or a
    bare equation (listed when the bound is exceeded)."""
    from mentor.stages.rules import RuleContext, answer_only, indirect_leak

    rows = [json.loads(line) for line in (SHARED_DATA / "math500" / "test.jsonl").read_text().splitlines()]
    flagged, total = [], 0
    for row in rows:
        first = re.split(r"(?<=[.?!])\s+", row["solution"].strip())[0]
        ctx = RuleContext(domain="math", answer=row["answer"])
        if ctx.matcher.leaks(first):
            continue
        total += 1
        if indirect_leak(first, ctx.matcher) or answer_only(first):
            flagged.append((first[:100], row["answer"]))
    assert total > 300
    assert len(flagged) <= 0.03 * total, flagged


def test_number_words_that_are_not_the_answer_pass():
    assert _v("The two trains meet once; use one equation per train.", "2") == []
    assert _v("Consider one of the three pairs.", "1") == []
    assert _v("She bakes a dozen muffins a day; how many eggs is that?", "18") == []
    assert _v("About three quarters of an hour passes first.", "45") == []


def test_words_and_expressions_combined():
    assert "answer_leak" in _v("Think of nine times two.", "18")
    assert "answer_leak" in _v("It is one hundred and five pages long.", "105")
    assert "answer_leak" in _v("Roughly three quarters of them stay.", r"\frac{3}{4}")
    assert "answer_leak" in _v("That is fifteen percent of the total.", "0.15")
    assert "answer_leak" in _v("Her profit is 70 thousand dollars.", "70000")


def test_evaluation_is_bounded():
    start = time.monotonic()
    hint = "Compare 9^9^9^9 with 10^1000000, (2^(2^(2^(2^(2^3)))))/3 and " + "(" * 200 + "1+" * 300 + "1" + ")" * 200
    assert "answer_leak" not in _v(hint, "11")
    assert time.monotonic() - start < 1.0


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k" / "test.jsonl").exists(), reason="real data")
def test_gsm8k_reference_steps_that_compute_the_answer_are_caught():
    """Real solution steps: one that computes the final answer (`9 * 2` for 18) leaks; the step before
    it, computing an intermediate value, does not."""
    rows = [json.loads(line) for line in (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:300]]
    caught = passed = 0
    for r in rows:
        answer = r["answer"].split("####")[-1].strip().replace(",", "")
        steps = [s for s in r["answer"].split("\n") if "<<" in s]
        if len(steps) < 2:
            continue
        last = re.search(r"<<([^=>]+)=([^>]+)>>", steps[-1])
        if not last or last.group(2).strip() != answer:
            continue
        expr = last.group(1).replace("*", " * ").replace("/", " / ")
        caught += "answer_leak" in _v(f"Now compute {expr} to finish.", answer)
        passed += 1
    assert passed > 150 and caught == passed


def test_garbage_hints_never_crash_the_rules():
    """Model output can be anything: the rules return violations, never raise (long digit runs included,
    which int() refuses past 4300 digits)."""
    import random

    odd = ["((((((", "^^^^", "\\sqrt{", "2^(", "1/0", "0^-1", "sqrt(-4)", "(-8)^(1/3)", "0/0", "2^-2000", "\\frac{1}{0}",
           "\\sqrt[0]{4}", "9^9^9", "2 ÷ 0", "√81", "+" * 1000, "1" * 5000, "1." + "2" * 5000, "(" * 3000 + "1" + ")" * 3000,
           "2^" * 500 + "2", "1/" + "3" * 5000, "\\frac{" + "1" * 5000 + "}{3}", "4 " + "1" * 5000 + "/3"]
    rng = random.Random(0)
    chars = "0123456789+-*/^()., x\\sqrtfrac{}[]%$"
    odd += ["".join(rng.choice(chars) for _ in range(rng.randint(1, 40))) for _ in range(400)]
    for text in odd:
        for answer in ("18", "-18", r"\frac{1}{2}", "1" * 5000):
            assert isinstance(check(text, "math", answer).violations, list)
