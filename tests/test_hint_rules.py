"""Rule checks: leak guard on real MATH-500 / GSM8K answers in many forms, and hints that must pass."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.stages.rules import RuleLimits, check


@pytest.fixture(scope="module")
def math500() -> dict[str, dict]:
    from mentor.data import bundled

    df = pl.read_parquet(bundled("math500_problems.parquet"))
    return {r["problem_id"]: r for r in df.iter_rows(named=True)}


@pytest.fixture(scope="module")
def gsm8k() -> list[dict]:
    from mentor.data import bundled

    return pl.read_parquet(bundled("gsm8k_problems.parquet")).head(200).to_dicts()


def _v(hint: str, answer: str, **kw) -> list[str]:
    return check(hint, "math", answer, **kw).violations


# 14/3 from MATH-500 (algebra/2584) in every form the issue lists, and more.
LEAKS_14_3 = [
    r"The value is $\frac{14}{3}$.",
    r"Simplify to $\dfrac{14}{3}$ at the end.",
    "You should get 14/3.",
    "It comes to about 4.666…",
    "It comes to about 4.666...",
    "Roughly 4.67.",
    "That is 4 2/3.",
    r"That is $4\frac{2}{3}$.",
    r"\boxed{\frac{14}{3}}",
    "The answer is 14/3.",
    r"Reduce $\frac{28}{6}$.",
    r"It equals 4.\overline{6}.",
]


@pytest.mark.parametrize("hint", LEAKS_14_3)
def test_fraction_answer_leaks_in_every_form(math500, hint):
    answer = math500["math500/algebra/2584"]["label"]
    assert answer == r"\frac{14}{3}"
    assert "answer_leak" in _v(hint, answer)


def test_fraction_answer_other_numbers_pass(math500):
    row = math500["math500/algebra/2584"]
    for hint in [
        "Evaluate f at -2, -1 and 0 separately, then add the three values.",
        "Watch the denominator x - 2 when you substitute; 3x - 2 changes sign.",
        r"Compute $f(0)$ first: the numerator is $-2$ and the denominator $-2$.",
    ]:
        assert _v(hint, row["label"], problem=row["problem"]) == [], hint


@pytest.mark.parametrize(
    "answer,leak,safe",
    [
        ("p - q", "Write the sum as p - q.", "Relate the double sum to the single sums p and q by grouping terms."),
        (r"\text{Evelyn}", "Evelyn has the greatest average speed.", "Compare the slopes of the lines through the origin."),
        (r"\left( 3, \frac{\pi}{2} \right)", r"The point is $(3, \frac{\pi}{2})$.", "Find r from the distance to the origin, then the angle."),
        (r"\left( 3, \frac{\pi}{2} \right)", "The point is (3, pi/2).", "The point lies on the positive y-axis."),
        ("90^\\circ", "The angle is 90 degrees.", "Use the dot product of the two direction vectors."),
        (r"3\sqrt{13}", r"The distance is $3\sqrt{13}$.", "Apply the distance formula with both coordinates."),
        ("6 - 5i", "You get 6-5i.", "Multiply out and collect the real and imaginary parts."),
        ("1,-2", "The roots are 1 and -2.", "Factor the quadratic first."),
        ("3, 5, 7", "They are 3, 5 and 7.", "Test small primes one by one."),
        ("0.15", "The probability is 15%.", "Count the favourable outcomes over all outcomes."),
        ("x=5", "So x = 5.", "Isolate x by moving the constants to one side."),
        ("-50", "The sum is -50.", "Pair the terms from both ends."),
        ("2220", "The total is 2,220.", "Multiply the count by the price of one."),
    ],
)
def test_math500_style_answers(answer, leak, safe):
    assert "answer_leak" in _v(leak, answer), leak
    assert "answer_leak" not in _v(safe, answer), safe


def test_every_math500_answer_is_caught_when_stated(math500):
    # The reference itself, wrapped as a student would write it, must always be caught.
    missed = []
    for pid, row in math500.items():
        answer = row["label"]
        hint = f"Your result should be ${answer}$ in the end."
        if "answer_leak" not in _v(hint, answer):
            missed.append((pid, answer))
    assert missed == []


def test_gsm8k_answers_leak_and_other_numbers_pass(gsm8k):
    import re

    checked = 0
    for row in gsm8k:
        answer = row["label"]
        # The answer itself, with thousands separators when large.
        n = int(answer.replace(",", ""))
        assert "answer_leak" in _v(f"She ends up with {n:,} in total.", answer), answer
        assert "answer_leak" in _v(f"So it is {n}.0 exactly.", answer), answer
        # Every number of the problem that differs from the answer may appear in a hint.
        others = sorted({x for x in re.findall(r"(?<![\d.,])\d+(?![\d,])", row["problem"]) if int(x) != abs(n)}, key=int)
        if len(others) >= 2:
            hint = f"Start from {others[0]} and {others[1]}, and decide which quantity the question asks for."
            assert _v(hint, answer, problem=row["problem"]) == [], (hint, answer)
            checked += 1
    assert checked > 50


def test_statement_solution_restatement_and_length():
    problem = "Tom has 3 apples and buys 4 more bags with 5 apples each. How many apples does Tom have now?"
    assert "final_answer_line" in _v("The final answer is whatever you get.", "23")
    assert "full_solution" in _v("4 * 5 = 20, 20 + 3 = 23, so total = 23.", "23")
    assert "full_solution" in _v("Step 1: count.\nStep 2: multiply.\nStep 3: add.", "23")
    assert "restates_problem" in _v("Tom has 3 apples and buys 4 more bags with 5 apples each.", "23", problem=problem)
    assert _v("Multiply the bags by the apples in each bag before adding the apples Tom already has.", "23", problem=problem) == []
    assert "too_long" in _v("Think. " * 10, "23")
    assert "too_long" in _v("x" * 300, "23", limits=RuleLimits(max_chars=100))
    assert _v("   ", "23") == ["empty"]
    assert _v("...", "23") == ["empty"]


def test_code_rules():
    label = json.dumps({"tests": "def check(c): pass", "entry_point": "has_close_elements", "kind": "humaneval"})
    leak = "```python\ndef has_close_elements(numbers, threshold):\n    return any(...)\n```"
    assert "solution_code" in check(leak, "code", label).violations
    assert "solution_code" in check("def has_close_elements(x, t): return True", "code", label).violations
    ok = "Sort the numbers first; then only neighbours can be the closest pair."
    assert check(ok, "code", label).ok


def test_repeat_and_language():
    prev = ["Think about the rate per hour."]
    assert "repeats_previous_hint" in _v("think about the rate per hour!", "18", previous_hints=prev)
    assert _v("Think about the rate per minute instead of per hour.", "18", previous_hints=prev) == []
    problem = "Janet's ducks lay 16 eggs per day. How much does she make every day at the market?"
    assert "wrong_language" in _v("计算她每天卖出的鸡蛋数量，然后乘以价格。", "18", problem=problem)
    assert "wrong_language" in _v("Посчитайте, сколько яиц остаётся на продажу.", "18", problem=problem)
    # Latin script, but not English: judged by English function words (SmolLM2 wrote this one).
    pt = "Não esperemos no problema. Não caso será desempeado de descargar para a desenho de tela."
    assert "wrong_language" in _v(pt, "18", problem=problem)
    assert "wrong_language" in _v("Cuenta los huevos que quedan después del desayuno y de hornear magdalenas.", "18", problem=problem)
    # Greek letters and accents are fine in a Latin-script problem.
    assert _v("Use the angle θ and the café's price per egg.", "18", problem=problem) == []


def test_check_hint_cli():
    runner = CliRunner()
    r = runner.invoke(cli, ["check-hint", "--answer", r"\frac{14}{3}", "It is 4 2/3."])
    assert r.exit_code == 1
    # A bare statement of the value is also only an answer (answer_only).
    assert json.loads(r.output) == {"ok": False, "violations": ["answer_leak", "answer_only"]}
    r = runner.invoke(cli, ["check-hint", "--answer", "18", "Count the eggs she eats and bakes first."])
    assert r.exit_code == 0
    assert json.loads(r.output) == {"ok": True, "violations": []}
    r = runner.invoke(cli, ["check-hint", "some hint"])
    assert r.exit_code == 2
    assert "--answer is required" in r.output
    r = runner.invoke(cli, ["check-hint", "--domain", "code", "--entry-point", "f", "def f(x): return x"])
    assert r.exit_code == 1
    assert "solution_code" in json.loads(r.output)["violations"]


def test_math_verify_timeout_errs_on_the_safe_side(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def slow(*a, **k):
        raise TimeoutException("too slow")

    real = math_verify.parse
    monkeypatch.setattr(math_verify, "parse", slow)
    # A symbolic expression math-verify could not judge in time counts as a leak, and is not cached: the next
    # check parses it again (an expression no other test parses, so nothing cached it before).
    hint = r"Consider $\frac{a+b}{c+4817}$ here."
    assert "answer_leak" in _v(hint, "p - q")
    parsed: list[str] = []

    def counting(text, *a, **k):
        parsed.append(text)
        return real(text, *a, **k)

    monkeypatch.setattr(math_verify, "parse", counting)
    assert "answer_leak" not in _v(hint, "p - q")
    assert any("4817" in t for t in parsed), parsed
    # Plain numbers never need math-verify.
    assert _v("Add 3 and 4 first.", "18") == []


def test_restated_numbers_and_list_headers_are_caught(gsm8k):
    janet = next(r for r in gsm8k if r["label"] == "18" and "Janet" in r["problem"])
    problem = janet["problem"]
    v = _v("Janet has 16 eggs, eats 3, bakes with 4 and sells the rest at $2 each.", "18", problem=problem)
    assert "restates_numbers" in v
    # Deriving a quantity is working with the data, not restating it; two numbers are not a restatement.
    assert _v("First find the eggs she sells: 16 - 3 - 4 = 9.", "18", problem=problem) == []
    assert _v("Subtract the 3 eaten and the 4 baked before pricing the eggs.", "18", problem=problem) == []


def test_an_operation_in_words_relates_the_numbers(gsm8k):
    """All three of the problem's numbers, joined by an operation said in words: a first step, not a restatement."""
    problem = next(r for r in gsm8k if r["label"] == "18" and "Janet" in r["problem"])["problem"]
    good = [
        "Subtract the 3 eaten and the 4 used for muffins from the 16 laid before pricing them.",
        "Take the 3 eaten and the 4 baked away from the 16 eggs, then multiply what is left by the price.",
        "Find the difference between the 16 eggs laid and the 3 plus 4 she uses.",
    ]
    for hint in good:
        assert _v(hint, "18", problem=problem) == [], hint
    # An operation word copied from the problem does not count: this only lists the data.
    laid = "Janet's ducks lay 16 eggs; she eats 3 and bakes with 4."
    assert "restates_numbers" in _v(laid, "18", problem=problem)
    for header in ["Here's the step-by-step breakdown:", "Let's solve it step by step.", "**Steps:**",
                   "To solve this, follow these steps:"]:
        assert "list_header" in _v(header, "18", problem=problem), header
    assert _v("Let the sold eggs be what remains after breakfast and baking, then price those.", "18", problem=problem) == []


def _gsm8k_solution_steps(shared_data) -> dict[str, list[str]]:
    """problem_id -> the steps of its GSM8K reference solution (calculator notes and the "####" line dropped)."""
    import re

    from mentor.pipeline.ids import text_id

    steps = {}
    with open(shared_data / "gsm8k" / "test.jsonl", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            lines = re.sub(r"<<[^>]*>>", "", r["answer"]).split("\n")[:-1]
            steps[text_id(r["question"])] = [s for s in lines if s.strip()]
    return steps


def test_restated_numbers_rule_spares_real_first_steps(gsm8k, shared_data):
    """The first step of every GSM8K reference solution (a strong, honest hint) passes the three newer rules."""
    steps = {pid: s[0] for pid, s in _gsm8k_solution_steps(shared_data).items()}
    flagged = []
    for row in gsm8k:
        v = check(steps[row["problem_id"]], "math", row["label"], problem=row["problem"]).violations
        if {"restates_numbers", "list_header", "starts_mid_sentence"} & set(v):
            flagged.append((steps[row["problem_id"]], v))
    assert len(flagged) <= 0.01 * len(gsm8k), flagged[:10]


def test_trim_keeps_the_leading_sentences_that_pass(gsm8k):
    """Hints the 1.5B hinter wrote on the dev split: a true first step, then the rest of the solution."""
    from mentor.stages.rules import RuleContext, check_hint, trim_to_rules

    kyle = next(r for r in gsm8k if r["label"] == "26" and "Kyle" in r["problem"])
    ctx = RuleContext(domain="math", answer="26", problem=kyle["problem"])
    hint = "To find the original price, divide the discounted price by 0.75. The original price is $26."
    v = check_hint(hint, ctx)
    assert "answer_leak" in v
    assert trim_to_rules(hint, ctx, v) == "To find the original price, divide the discounted price by 0.75."
    # Nothing to keep: the first sentence leaks already, or what is left is too short to be a hint.
    leak_first = "The original price is $26, since 19.50 / 0.75 = 26. Check it against the discount."
    assert trim_to_rules(leak_first, ctx, check_hint(leak_first, ctx)) is None
    short = "Divide by 0.75. The original price is $26."
    assert trim_to_rules(short, ctx, check_hint(short, ctx)) is None
    # A violation cutting cannot cure is left to the repair agent.
    assert trim_to_rules(hint, ctx, ["wrong_language"]) is None
    assert trim_to_rules(hint, ctx, []) is None


def test_hints_that_loop_are_caught_and_trimmed(gsm8k, shared_data):
    """A loop the 1.5B hinter wrote on the dev split (its first two sentences) and one of the same shape, cut back
    to what comes before the repeat; honest text that names a quantity twice is spared."""
    from mentor.stages.rules import RuleContext, check_hint, trim_to_rules

    looping = ("First, calculate the total number of students by multiplying the number of classes each day "
               "(5 weekdays + 1 Saturday) by the number of students per class (15). Then, calculate the total number "
               "of classes by multiplying the number of classes each day (5 weekdays + 1 Saturday) by the number of "
               "classes per day (8).")
    assert "repeats_itself" in _v(looping, "999")
    sophia = next(r for r in gsm8k if "Sophia" in r["problem"] and "tank" in r["problem"])
    ctx = RuleContext(domain="math", answer=sophia["label"], problem=sophia["problem"])
    loop = ("To find out how many miles Sophia can drive on a single tank of gas, divide the distance she drove by "
            "the gallons she used. Then multiply by the size of the tank. To find out how many miles she can drive "
            "on a single tank of gas, divide the distance she drove by the gallons she used.")
    v = check_hint(loop, ctx)
    assert "repeats_itself" in v
    assert trim_to_rules(loop, ctx, v) == ("To find out how many miles Sophia can drive on a single tank of gas, "
                                           "divide the distance she drove by the gallons she used. Then multiply "
                                           "by the size of the tank.")
    fine = ("Consider the total number of days in the first year and the number of cups per bag. Divide the total "
            "number of days by the number of cups per bag.")
    assert "repeats_itself" not in _v(fine, "999")
    # Real solution text: no GSM8K first step is flagged, and at most 1% of the first halves of a solution.
    solutions = _gsm8k_solution_steps(shared_data).values()
    firsts = [steps[0] for steps in solutions]
    halves = [" ".join(steps[: max(1, len(steps) // 2)]) for steps in solutions]
    assert not [s for s in firsts if "repeats_itself" in _v(s, "999")]
    assert sum("repeats_itself" in _v(s, "999") for s in halves) <= 0.01 * len(halves)


def test_hints_that_talk_about_the_pipeline_are_caught():
    """The solver never sees the reference answer or the rejected hint the agents are shown."""
    for hint in ["The reference answer provides the answer to the problem.",
                 "The rejected hint is incorrect because it contradicts the reference answer.",
                 "Unlike the previous hint, first count the eggs she sells."]:
        assert "mentions_pipeline" in _v(hint, "18"), hint
    for fine in ["Count the eggs she sells before you price them; the hint is in the word 'remainder'.",
                 "Count how many problems the students attempt before you work out the share they solve."]:
        assert _v(fine, "18") == [], fine


def test_hints_that_start_mid_sentence_are_caught():
    """The 1.5B hinter sometimes stops its JSON "reasoning" mid-sentence and goes on in "hint"; these three
    fragments passed every other rule in the math report-split run (one was the only hint `full` let through)."""
    from mentor.data import bundled

    for fragment in ["cook the chicken. Since it takes 5 minutes less time to cook than it took to warm up the oil, "
                     "we can subtract 5 minutes from the 28 minutes.",
                     "original cost of the jogger jeans, which is $6 - $2 = $4.",
                     "distance Polly can stand is not limited by the dragon's flames."]:
        assert "starts_mid_sentence" in _v(fragment, "999"), fragment
    for fine in ["Cook the chicken only after the oil is hot.", "x is the number of eggs left after breakfast.",
                 "gcd(a, b) divides both numbers.", "x-values come first.",
                 "A first step: 16 - 3 - 4 = 9 eggs are left to sell."]:
        assert _v(fine, "999") == [], fine
    # In code a lowercase first word from the prompt is an identifier, not a fragment.
    task = pl.read_parquet(bundled("humaneval_problems.parquet")).row(0, named=True)
    assert "numbers" in task["problem"]
    assert check("numbers may hold two equal values; compare every pair once.", "code", task["label"],
                 problem=task["problem"]).ok
    assert "starts_mid_sentence" in check("pair of the numbers that are closer than the threshold.", "code",
                                          task["label"], problem=task["problem"]).violations


def test_each_rule_is_declared_once_in_the_registry():
    """Name, repair message, trimmable and check live in one declaration; the rules run in declaration order."""
    from mentor.stages.rules import RuleRegistry, describe

    names = RuleRegistry.names()
    assert names[:3] == ("empty", "too_long", "answer_leak") and len(set(names)) == len(names) == 16
    assert names[-1] == "special_token"  # declared in its own module, after `checks`
    assert all(describe(n) == RuleRegistry.get(n).description != n for n in names)
    assert describe("judge_low_score") == "the judge scored the hint below the threshold" and describe("other") == "other"
    assert RuleRegistry.trimmable() == {"too_long", "answer_leak", "final_answer_line", "full_solution", "answer_only",
                                        "restates_numbers", "repeats_itself", "mentions_pipeline"}
    assert [r.name for r in RuleRegistry.rules("math") if r.domain] == ["answer_only"]
    assert [r.name for r in RuleRegistry.rules("code") if r.domain] == ["solution_code"]
    with pytest.raises(ValueError, match="declared twice"):
        RuleRegistry.add("empty", "again")(lambda text, ctx: False)
    with pytest.raises(KeyError, match="no rule named"):
        RuleRegistry.get("answer_leaks")
    # Violations come in declaration order; an empty hint has that one violation alone.
    assert check("   ", "math", "18").violations == ["empty"]
    assert check("The answer is 18.", "math", "18").violations == ["answer_leak", "final_answer_line"]
