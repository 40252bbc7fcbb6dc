"""`mentor hint`, `check-hint`, `run`, `train`, `inspect` over a corpus of bad inputs (real GSM8K data, fake LLM backend)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from bad_input_lib import Case, invoke, params, run_case

LAUGHS = (
    "lol: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"l{i}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
)


def _collapsed() -> pl.DataFrame:
    from mentor.data import bundled
    from mentor.stages.mine import MineConfig
    from mine_lib import mine

    df, _ = mine([str(bundled("gsm8k_rollouts.parquet"))], MineConfig())
    return df.head(6)


COLLAPSED = _collapsed()


# --------------------------------------------------------------------------- hint


def _hint(root: Path, frame: pl.DataFrame | None = COLLAPSED, *extra: str) -> list[str]:
    if frame is not None:
        frame.write_parquet(root / "c.parquet")
    return ["hint", str(root / "c.parquet"), "--out", str(root / "out"), "--backend", "fake", "--no-progress", *extra]


def _config(root: Path, text: str) -> str:
    (root / "hint.yaml").write_text(text)
    return str(root / "hint.yaml")


def _first(n: int) -> pl.Expr:
    return pl.int_range(pl.len()) < n


def hint_cases() -> list[Case]:
    c = COLLAPSED
    cases = [
        Case("hint-ok", "handled", lambda r: _hint(r), 0),
        Case("hint-missing-input", "error", lambda r: _hint(r, None), 2, r"c\.parquet: no such file"),
        Case("hint-null-problem-text", "error",
             lambda r: _hint(r, c.with_columns(problem=pl.when(_first(1)).then(None).otherwise("problem"))), 1,
             r"c\.parquet: column 'problem' is null in 1 row\(s\)"),
        Case("hint-null-problem-id", "error",
             lambda r: _hint(r, c.with_columns(problem_id=pl.when(_first(1)).then(None).otherwise("problem_id"))), 1,
             r"c\.parquet: column 'problem_id' is null"),
        Case("hint-duplicate-problem", "error", lambda r: _hint(r, pl.concat([c, c.head(1)])), 1, r"appear\(s\) more than once"),
        Case("hint-unknown-domain", "error", lambda r: _hint(r, c.with_columns(domain=pl.lit("chem"))), 1,
             r"domain \['chem'\] is not one of math, code"),
        Case("hint-rollouts-given", "error", lambda r: _hint(r, pl.read_parquet(_bundled("gsm8k_rollouts.parquet")).head(5)), 1,
             r"not a 'collapsed' dataset"),
        Case("hint-config-duplicate-key", "error", lambda r: _hint(r, c, "--config", _config(r, "max_retry: 1\nmax_retry: 2\n")), 2,
             r"hint\.yaml: line 2, column 1: not valid YAML: duplicate key 'max_retry' \(first at line 1\)"),
        Case("hint-config-billion-laughs", "error", lambda r: _hint(r, c, "--config", _config(r, LAUGHS)), 2,
             r"hint\.yaml: line \d+, column \d+: not valid YAML: expands to more than", max_seconds=2),
        Case("hint-config-not-a-mapping", "error", lambda r: _hint(r, c, "--config", _config(r, "- 1\n- 2\n")), 2,
             r"expected a mapping"),
        Case("hint-config-unknown-field", "error", lambda r: _hint(r, c, "--config", _config(r, "max_retries: 3\n")), 2,
             r"max_retries"),
        Case("hint-config-missing", "error", lambda r: _hint(r, c, "--config", str(r / "nope.yaml")), 2, r"nope\.yaml: no such"),
        Case("hint-config-not-utf8", "error", lambda r: (r / "h.yaml").write_bytes(b"max_retry: \xff\n") and
             _hint(r, c, "--config", str(r / "h.yaml")), 2, r"h\.yaml: not UTF-8"),
    ]
    for opt, v in [("--sample", "0"), ("--shard-size", "0"), ("--gpu-memory-utilization", "1.5"), ("--gpu-memory-utilization", "0"),
                   ("--gpu-memory-utilization", "nan"), ("--tensor-parallel-size", "0"), ("--max-model-len", "0"), ("--workers", "0"),
                   ("--sample", str(2**70)), ("--seed", "-1"), ("--seed", str(2**70))]:
        cases.append(Case(f"hint-option{opt}={v}", "error", lambda r, o=opt, v=v: _hint(r, c, o, v), 2, opt))
    return cases


def _bundled(name: str) -> Path:
    from mentor.data import bundled

    return bundled(name)


# --------------------------------------------------------------------------- check-hint


def check_hint_cases() -> list[Case]:
    def ch(answer: str, hint: str, *extra: str):
        return lambda r: ["check-hint", "--answer", answer, hint, *extra]

    def violations(*names: str):
        def check(root: Path, res) -> None:
            got = json.loads(res.output.strip().splitlines()[-1])["violations"]
            assert set(names) <= set(got), got

        return check

    # Real GSM8K (18, 3, 70000) and MATH-500 (\frac{14}{3}) answers.
    leaks = [
        ("power", "27", "Start from 3^3 and compare."), ("product", "18", "It comes to 2*9 dollars."),
        ("sqrt", "9", r"Think of $\sqrt{81}$."), ("latex-times", "18", r"Compute $9 \times 2$ first."),
        ("words", "18", "She makes eighteen dollars."), ("words-compound", "105", "It is one hundred and five pages."),
        ("words-fraction", "0.75", "About three quarters of them stay."), ("words-times", "18", "Try nine times two."),
        ("words-scale", "70000", "The profit is seventy thousand dollars."),
        ("fraction-expr", r"\frac{14}{3}", r"Simplify $\frac{28}{6}$ at the end."),
    ]
    cases = [Case(f"check-hint-leak-{cid}", "handled", ch(a, h), 1, check=violations("answer_leak")) for cid, a, h in leaks]
    for cid, a, h in [("answer-line", "18", "A: 66"), ("bare-number", "18", "66"), ("bare-with-unit", "18", "66 dollars"),
                      ("answer-label", "18", "Answer: 12"), ("bare-fraction", "3", r"$\frac{1}{2}$"), ("hint-label-value", "18", "Hint: 66")]:
        cases.append(Case(f"check-hint-answer-only-{cid}", "handled", ch(a, h), 1, check=violations("answer_only")))
    honest = [("eggs", "18", "Find how many eggs are left after breakfast and baking, then think about the price per egg."),
              ("two-cases", "2", "Consider the two cases separately."), ("one-of", "1", "Look at one of the triangles first."),
              ("partial", "18", "She has 16 - 3 - 4 eggs to sell; what does each one earn?"),
              ("variable", "4", r"Note that $n < 3^{n-3}$ and $n-1 < 2\cdot 2^{n-3}$ for large n.")]
    cases += [Case(f"check-hint-honest-{cid}", "handled", ch(a, h), 0) for cid, a, h in honest]
    cases += [
        Case("check-hint-max-chars-0", "error", ch("1", "x", "--max-chars", "0"), 2, r"--max-chars"),
        Case("check-hint-max-sentences-0", "error", ch("1", "x", "--max-sentences", "0"), 2, r"--max-sentences"),
        Case("check-hint-no-answer", "error", lambda r: ["check-hint", "x"], 2, r"--answer is required"),
        Case("check-hint-bounded-power", "handled", ch("7", "Compare 10^1000000 with 2^(2^(2^(2^(2^3)))) and 9^9^9^9."), 0, max_seconds=2),
    ]
    return cases


# --------------------------------------------------------------------------- check-judge


def _judge(root: Path, frame: pl.DataFrame | None = COLLAPSED, *extra: str) -> list[str]:
    if frame is not None:
        frame.write_parquet(root / "c.parquet")
    return ["check-judge", str(root / "c.parquet"), "--backend", "fake", *extra]


def check_judge_cases() -> list[Case]:
    c = COLLAPSED
    # Problems no solution source knows: ids the bundled sets do not have, and no solution carried by mine.
    unknown_ids = c.with_columns(pl.concat_str(pl.lit("x-"), pl.col("problem_id")).alias("problem_id"),
                                 pl.lit(None, pl.String).alias("solution"))
    return [
        # The canned fake judge approves everything: a coin flip, found out (exit 1, one summary line).
        Case("check-judge-coin-flip", "handled", lambda r: _judge(r), 1, r"^judge check: balanced accuracy 0\.5 on 24 calibration hints"),
        Case("check-judge-missing-input", "error", lambda r: _judge(r, None), 2, r"c\.parquet: no such file"),
        Case("check-judge-rollouts-given", "error", lambda r: _judge(r, pl.read_parquet(_bundled("gsm8k_rollouts.parquet")).head(5)),
             1, r"not a 'collapsed' dataset"),
        Case("check-judge-no-solutions", "error", lambda r: _judge(r, unknown_ids), 1,
             r"c\.parquet: none of its 6 collapsed problems has a reference solution .* pass --solutions FILE"),
        Case("check-judge-solutions-missing", "error", lambda r: _judge(r, c, "--solutions", str(r / "s.jsonl")), 2,
             r"s\.jsonl: judge_check\.solutions file not found"),
        Case("check-judge-solutions-bad-columns", "error",
             lambda r: (r / "s.jsonl").write_text('{"id": 1}\n') and _judge(r, c, "--solutions", str(r / "s.jsonl")), 1,
             r"s\.jsonl: judge_check\.solutions lacks column\(s\) \['problem_id', 'solution'\]"),
        Case("check-judge-config-unknown-field", "error",
             lambda r: _judge(r, c, "--config", _config(r, "judge_check: {min_accuracy: 0.9}\n")), 2, r"judge_check\.min_accuracy"),
        Case("check-judge-config-threshold", "error",
             lambda r: _judge(r, c, "--config", _config(r, "judge_check: {min_balanced_accuracy: 2}\n")), 2,
             r"judge_check\.min_balanced_accuracy"),
        Case("check-judge-problems-0", "error", lambda r: _judge(r, c, "--problems", "0"), 2, r"--problems"),
    ]


# --------------------------------------------------------------------------- run


def workflow(root: Path, **change) -> dict:
    """A one-round workflow on 12 real GSM8K problems and their real rollouts, fake hint model."""
    from mentor.data import bundled

    rollouts = pl.read_parquet(bundled("gsm8k_rollouts.parquet"))
    ids = rollouts["problem_id"].unique().sort().head(12).to_list()
    problems = pl.read_parquet(bundled("gsm8k_problems.parquet")).filter(pl.col("problem_id").is_in(ids))
    problems.write_parquet(root / "problems.parquet")
    rollouts.filter(pl.col("problem_id").is_in(ids)).write_parquet(root / "initial.parquet")
    wf = {"name": "wf-bad", "base": str(root / "problems.parquet"), "rounds": 1,
          "initial_rollouts": {"source": [str(root / "initial.parquet")], "format": "canonical"},
          "trainer": {"kind": "offline"},
          "hint": {"backend": {"backend": "fake", "options": {"script": "mentor.stages.hint.agents:fake_script"}}}}
    wf.update(change)
    return wf


def _run(root: Path, text: str | None = None, *extra: str, **change) -> list[str]:
    path = root / "wf.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(workflow(root, **change)))
    return ["run", str(path), "--run-dir", str(root / "out"), *extra]


def nothing_ran(root: Path, res) -> None:
    # Checked before any stage runs: no round folder (or run folder) was made.
    assert not (root / "out").exists() or not list((root / "out").glob("round-*")), list((root / "out").iterdir())


def run_cases() -> list[Case]:
    def named(name: str):
        def make(r: Path) -> list[str]:
            (r / "wf.yaml").write_text(yaml.safe_dump(workflow(r, name=name)))
            return ["run", str(r / "wf.yaml")]  # the default run folder: runs/<name> (working folder: the case folder)

        return make

    def dup_key(r: Path) -> list[str]:
        text = yaml.safe_dump(workflow(r), sort_keys=False) + "rounds: 2\n"
        return _run(r, text)

    def laughs(r: Path) -> list[str]:
        wf = workflow(r)
        text = LAUGHS + yaml.safe_dump(wf, sort_keys=False).replace("options:\n", "options:\n      bomb: *i\n", 1)
        return _run(r, text)

    def dup_base(r: Path) -> list[str]:
        wf = workflow(r)
        p = pl.read_parquet(r / "problems.parquet")
        pl.concat([p, p.head(2)]).write_parquet(r / "problems.parquet")
        return _run(r, yaml.safe_dump(wf))

    def wrong_base_columns(r: Path) -> list[str]:
        wf = workflow(r)
        pl.read_parquet(r / "problems.parquet").drop("label").write_parquet(r / "problems.parquet")
        return _run(r, yaml.safe_dump(wf))

    def deep(r: Path) -> list[str]:
        return _run(r, yaml.safe_dump(workflow(r)) + "build: " + "[" * 500 + "]" * 500 + "\n")

    def recursive(r: Path) -> list[str]:
        return _run(r, yaml.safe_dump(workflow(r)).replace("rounds: 1", "rounds: 1\nbuild: &x {a: *x}"))

    def corrupt_marker(r: Path) -> list[str]:
        args = _run(r)
        assert invoke(args).exit_code == 0
        marker = next((r / "out" / "round-000" / "collapsed" / "_done").glob("*.done"))
        marker.write_text('{"key": "ab')  # cut short
        return args

    def corrupt_failed(r: Path) -> list[str]:
        d = r / "run" / "round-000" / "collapsed"
        d.mkdir(parents=True)
        (d / "_failed.json").write_text("{bad")
        return ["status", str(r / "run")]

    return [
        Case("run-ok", "handled", lambda r: _run(r), 0),
        Case("run-rounds-negative", "error", lambda r: _run(r, None, "--rounds", "-1"), 2, r"--rounds", check=nothing_ran),
        Case("run-rounds-zero", "error", lambda r: _run(r, None, "--rounds", "0"), 2, r"--rounds", check=nothing_ran),
        Case("run-sample-zero", "error", lambda r: _run(r, None, "--sample", "0"), 2, r"--sample"),
        Case("run-name-slash", "error", named("a/b"), 2, r"name: 'a/b' is not a safe run name", check=nothing_ran),
        Case("run-name-dotdot", "error", named(".."), 2, r"name: '\.\.' is not a safe run name"),
        *(Case(f"run-name-{what}", "error", named(name), 2, r"is not a safe run name")
          for what, name in (("escape", "../../etc"), ("absolute", "/tmp/x"), ("empty", ""), ("hidden", ".runs"),
                             ("backslash", "a\\b"))),
        Case("run-name-with-space-and-accent", "handled", named("essai été"), 0,
             check=lambda r, res: (r / "a" / "b" / "runs" / "essai été" / "round-000" / "prompts" / "manifest.json").is_file()),
        Case("run-duplicate-key", "error", dup_key, 2, r"wf\.yaml: line \d+, column 1: not valid YAML: duplicate key 'rounds'",
             check=nothing_ran),
        Case("run-billion-laughs-in-backend-options", "error", laughs, 2, r"not valid YAML: expands to more than", max_seconds=2,
             check=nothing_ran),
        Case("run-deep-nesting", "error", deep, 2, r"nested deeper than"),
        Case("run-recursive-alias", "error", recursive, 2, r"recursive alias"),
        Case("run-base-duplicate-ids", "error", dup_base, 1, r"problems\.parquet: 2 duplicate problem_id", check=nothing_ran),
        Case("run-base-missing", "error", lambda r: _run(r, None, base=str(r / "gone.parquet")), 2, r"gone\.parquet: no such file",
             check=nothing_ran),
        Case("run-base-wrong-columns", "error", wrong_base_columns, 1, r"column\(s\) 'label' missing", check=nothing_ran),
        Case("run-unknown-key", "error", lambda r: _run(r, None, rounds_=2), 2, r"rounds_: unknown key"),
        Case("run-not-a-mapping", "error", lambda r: _run(r, "[1, 2]\n"), 2, r"expected a mapping"),
        Case("run-rounds-in-file-negative", "error", lambda r: _run(r, None, rounds=-1), 2, r"rounds: Input should be greater"),
        Case("run-workflow-missing", "error", lambda r: ["run", str(r / "nope.yaml")], 2, r"nope\.yaml: no such workflow file"),
        Case("run-corrupt-done-marker", "error", corrupt_marker, 1, r"\.done: not valid JSON .*delete it and re-run"),
        Case("status-corrupt-failed-marker", "handled", corrupt_failed, 0, check=lambda r, res: "unreadable" in res.output),
    ]


# --------------------------------------------------------------------------- train (--dry-run runs OpenRLHF's own checks)


def _train(root: Path, extra_args: dict | None = None, text: str | None = None, **kw) -> list[str]:
    conf = {"round": 0, "round_dir": str(root / "round-000"), "base_model": "Qwen/Qwen2.5-0.5B-Instruct", **kw}
    if extra_args is not None:
        conf["extra_args"] = extra_args
    (root / "round.yaml").write_text(text if text is not None else yaml.safe_dump(conf))
    return ["train", "--config", str(root / "round.yaml"), "--dry-run"]


def train_cases() -> list[Case]:
    pytest.importorskip("openrlhf")
    return [
        Case("train-ok", "handled", lambda r: _train(r), 0),
        Case("train-dynamic-filtering-range", "error",
             lambda r: _train(r, {"algo.dynamic_filtering_enable": True, "algo.dynamic_filtering_range": [1, 0]}), 2,
             r"round\.yaml: extra_args: algo\.dynamic_filtering_range \[1, 0\]: give \[low, high\] with low < high"),
        Case("train-batch-too-small", "error",
             lambda r: _train(r, {"rollout.batch_size": 1, "rollout.micro_batch_size": 8}, actor_gpus_per_node=8), 2,
             r"number of sample batches must be greater than or equal to the effective number of actor processes"),
        Case("train-unknown-flag", "error", lambda r: _train(r, {"algo.no_such_flag": 1}), 2, r"unrecognized arguments: --algo\.no_such_flag"),
        Case("train-partial-without-async", "error", lambda r: _train(r, {"train.partial_rollout_enable": True}), 2,
             r"--train\.partial_rollout_enable requires --train\.async_enable"),
        Case("train-bad-choice", "error", lambda r: _train(r, advantage_estimator="nope"), 2, r"invalid choice"),
        Case("train-duplicate-key", "error", lambda r: _train(r, text="base_model: a\nbase_model: b\nround_dir: x\n"), 2,
             r"round\.yaml: line 2, column 1: not valid YAML: duplicate key 'base_model'"),
        Case("train-billion-laughs", "error", lambda r: _train(r, text=LAUGHS + "base_model: m\nround_dir: x\nenv: {X: *i}\n"), 2,
             r"expands to more than", max_seconds=2),
        Case("train-n-samples-1", "error", lambda r: _train(r, n_samples_per_prompt=1), 2, r"n_samples_per_prompt"),
    ]


HINT, CHECK, RUN, TRAIN = hint_cases(), check_hint_cases(), run_cases(), None
JUDGE = check_judge_cases()


@pytest.mark.parametrize("case", params(HINT))
def test_hint_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


@pytest.mark.parametrize("case", params(CHECK))
def test_check_hint_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


@pytest.mark.parametrize("case", params(JUDGE))
def test_check_judge_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


@pytest.mark.parametrize("case", params(RUN))
def test_run_bad_input(case: Case, tmp_path, monkeypatch):
    work = tmp_path / "case" / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)  # runs/<name> would land here; "../../etc" two levels up
    run_case(case, tmp_path / "case")
    if case.exit != 0:
        assert not (work / "runs").exists() and not (tmp_path / "case" / "etc").exists()


@pytest.mark.parametrize("case", params(train_cases()) if __import__("importlib").util.find_spec("openrlhf") else [])
def test_train_dry_run_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


def test_run_base_checked_before_the_run_folder_exists(tmp_path):
    """A duplicate-id base set fails before any stage runs: no run folder, no workflow.yaml, nothing trained or hinted."""
    (tmp_path / "c").mkdir()
    res = invoke(next(c for c in run_cases() if c.id == "run-base-duplicate-ids").make(tmp_path / "c"))
    assert res.exit_code == 1 and "duplicate problem_id" in res.output
    assert not (tmp_path / "c" / "out").exists()
    shutil.rmtree(tmp_path / "c")
