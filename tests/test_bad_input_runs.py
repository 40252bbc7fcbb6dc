"""`mentor status` on damaged run folders, `mentor train --dry-run` on rounds that cannot run, and workflows whose
settings are wrong somewhere a stage would only find late (real GSM8K data, fake hint model).

A run folder is a real one (`mentor run` of one round), then one bookkeeping file is edited by
hand, cut short, or replaced by a value of the wrong type. `status` must still show the run (the
damaged stage as interrupted or failed, the damaged counts as unknown), never a traceback, and
never a stage as running because its pid reads as "every process". A workflow is checked whole
before its first stage runs: the error names the file and the key, and no round folder is made.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from bad_input_lib import Case, invoke, params, run_case
from test_bad_input_commands import nothing_ran, workflow

# --------------------------------------------------------------------------- status on a damaged run


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real-run")
    (root / "wf.yaml").write_text(yaml.safe_dump(workflow(root)))
    res = invoke(["run", str(root / "wf.yaml"), "--run-dir", str(root / "run")])
    assert res.exit_code == 0, res.output
    return root / "run"


_RUN: dict[str, Path] = {}


@pytest.fixture(autouse=True)
def _the_run(request):
    if "status" in request.node.name:
        _RUN["path"] = request.getfixturevalue("real_run")


def _damaged(stage: str, name: str, content: str | bytes | None):
    """A copy of the real run with round 0's `stage` folder's `name` replaced by `content` (None: a folder)."""
    def make(root: Path) -> list[str]:
        run = root / "run"
        shutil.copytree(_RUN["path"], run)
        f = run / "round-000" / stage / name
        f.unlink(missing_ok=True)
        if content is None:
            f.mkdir()
        elif isinstance(content, bytes):
            f.write_bytes(content)
        else:
            f.write_text(content)
        return ["status", str(run), "--format", "json"]
    return make


def _row(res, stage: str) -> dict:
    rows = json.loads(res.output)
    return next(r for r in rows if r["round"] == 0 and r["stage"] == stage)


def state_is(stage: str, state: str, **fields):
    def check(root: Path, res) -> None:
        row = _row(res, stage)
        assert row["state"] == state, row
        for k, v in fields.items():
            assert row.get(k) == v, row
    return check


def failed_unreadable(root: Path, res) -> None:
    row = _row(res, "mine")
    assert row["state"] == "failed" and "its error message was lost" in row["error"], row


def status_cases() -> list[Case]:
    cases = []
    running = [("pid-text", '{"pid": "abc"}'), ("pid-list", '{"pid": [1]}'), ("pid-null", '{"pid": null}'),
               ("pid-minus-one", '{"pid": -1}'), ("pid-zero", '{"pid": 0}'), ("pid-huge", '{"pid": 1180591620717411303424}'),
               ("pid-float", '{"pid": 1.5}'), ("pid-true", '{"pid": true}'), ("a-list", "[1, 2]"), ("a-string", '"x"'),
               ("torn", '{"pid": 12'), ("empty", ""), ("not-utf8", b'{"pid": "\xff"}'), ("a-folder", None)]
    for name, content in running:
        cases.append(Case(f"status-running-{name}", "handled", _damaged("hints", "_running.json", content), 0,
                          check=state_is("hint", "interrupted")))
    stats = [("a-list", "[1, 2]", None), ("a-string", '"x"', None), ("rows-a-mapping", '{"problems": {"a": 1}, "accepted": 3}', None),
             ("counts-a-list", '{"problems": [1], "accepted": "many"}', None), ("torn", '{"problems": ', None),
             ("not-utf8", b'{"problems": "\xff"}', None), ("a-folder", None, None)]
    for name, content, rows in stats:
        cases.append(Case(f"status-stats-{name}", "handled", _damaged("hints", "stats.json", content), 0,
                          check=state_is("hint", "done", rows=rows)))
    for name, content in [("torn", '{"exit_code": '), ("a-list", "[0]"), ("exit-code-a-mapping", '{"exit_code": {"x": 1}}'),
                          ("not-utf8", b'\xff\xfe'), ("a-folder", None)]:
        cases.append(Case(f"status-outcome-{name}", "handled", _damaged("train", "outcome.json", content), 0,
                          check=state_is("train", "done", exit_code=None)))
    for name, content in [("error-a-number", '{"error": 5}'), ("error-null", '{"error": null}'), ("a-list", "[1]"),
                          ("error-a-list", '{"error": ["a"]}'), ("empty", ""), ("error-empty", '{"error": ""}')]:
        cases.append(Case(f"status-failed-{name}", "handled", _damaged("collapsed", "_failed.json", content), 0,
                          check=failed_unreadable))

    def folder(make):
        def m(root: Path) -> list[str]:
            make(root / "d")
            return ["status", str(root / "d")]
        return m

    cases += [
        Case("status-empty-folder", "error", folder(lambda d: d.mkdir()), 2, r"d: not a run directory \(no workflow\.yaml"),
        Case("status-only-odd-rounds", "error", folder(lambda d: (d / "round-abc").mkdir(parents=True)), 2, r"not a run directory"),
        Case("status-round-a-file", "error", folder(lambda d: d.mkdir() or (d / "round-000").write_text("x")), 2,
             r"not a run directory"),
        Case("status-a-file", "error", lambda r: (r / "f").write_text("x") and ["status", str(r / "f")], 2, r"is a file"),
    ]
    return cases


# --------------------------------------------------------------------------- train --dry-run


def _round(root: Path, **conf) -> list[str]:
    (root / "round.yaml").write_text(yaml.safe_dump({"round": 0, "round_dir": str(root / "round-000"), **conf}))
    return ["train", "--config", str(root / "round.yaml"), "--dry-run"]


def _prompts(root: Path) -> bool:
    from mentor.stages.build import BUILD, BuildConfig

    BUILD({}, BuildConfig(base="humaneval", round=0, shard_rows=100), root / "round-000" / "prompts")
    return True


def train_cases() -> list[Case]:
    cases = []
    for kind in ("trl", "verl", None):
        k = {"kind": kind} if kind else {}
        label = kind or "openrlhf"
        cases += [
            Case(f"train-{label}-base-model-no-folder", "error", lambda r, k=k: _round(r, base_model=str(r / "models" / "gone"), **k), 2,
                 r"round\.yaml: base_model: no such folder .*found: '/"),
            Case(f"train-{label}-base-model-relative-no-folder", "error", lambda r, k=k: _round(r, base_model="./ckpt/policy", **k), 2,
                 r"round\.yaml: base_model: no such folder"),
            Case(f"train-{label}-base-model-a-file", "error",
                 lambda r, k=k: (r / "m.bin").write_text("x") and _round(r, base_model=str(r / "m.bin"), **k), 2,
                 r"base_model: is a file, not a model folder"),
            Case(f"train-{label}-actor-model-no-folder", "error",
                 lambda r, k=k: _round(r, base_model="Qwen/Qwen2.5-0.5B-Instruct", actor_model="/nonexistent/round-003/model", **k), 2,
                 r"actor_model: no such folder"),
        ]
    cases += [
        Case("train-verl-save-freq-0", "error", lambda r: _round(r, kind="verl", overrides={"trainer.save_freq": 0}), 2,
             r"round\.yaml: overrides\.trainer\.save_freq 0: must be > 0: .*merge_model: false"),
        Case("train-verl-save-freq-minus-one", "error", lambda r: _round(r, kind="verl", overrides={"++trainer.save_freq": -1}), 2,
             r"save_freq -1: must be > 0"),
        Case("train-verl-save-freq-0-no-merge", "handled",
             lambda r: _prompts(r) and _round(r, kind="verl", merge_model=False, overrides={"trainer.save_freq": 0}), 0),
        Case("train-openrlhf-dynamic-filtering-reversed", "error",
             lambda r: _round(r, base_model="Qwen/Qwen2.5-0.5B-Instruct",
                              extra_args={"algo.dynamic_filtering_enable": True, "algo.dynamic_filtering_range": [1, 0]}), 2,
             r"extra_args: algo\.dynamic_filtering_range \[1, 0\]: give \[low, high\] with low < high"),
        Case("train-openrlhf-dynamic-filtering-one-value", "error",
             lambda r: _round(r, base_model="Qwen/Qwen2.5-0.5B-Instruct", extra_args={"algo.dynamic_filtering_range": 0.5}), 2,
             r"algo\.dynamic_filtering_range 0\.5: give \[low, high\]"),
    ]
    return cases


# --------------------------------------------------------------------------- workflows checked whole


def _wf(**change):
    def make(root: Path) -> list[str]:
        wf = workflow(root)
        for dotted, value in change.items():
            node = wf
            *parents, last = dotted.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        (root / "wf.yaml").write_text(yaml.safe_dump(wf))
        return ["run", str(root / "wf.yaml"), "--run-dir", str(root / "out")]
    return make


SERVER = {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}


def workflow_cases() -> list[Case]:
    c = []
    for opt, value, why in [("max_concurrency", 0, r"must be a whole number >= 1"), ("max_concurrency", "64", r"got '64'"),
                            ("max_retries", -1, r">= 0"), ("timeout", 0, r"seconds > 0"), ("timeout", ".nan", r"seconds > 0"),
                            ("structured_output", "json", r"choose one of"), ("tensor_parallel_size", 2, r"not an option of the openai")]:
        value = float("nan") if value == ".nan" else value
        c.append(Case(f"workflow-server-{opt}-{value}", "error", _wf(hint__backend=SERVER | {"options": {opt: value}}), 2,
                      rf"wf\.yaml: hint\.backend\.options\.{opt}: .*{why}", check=nothing_ran))
    for url in ("localhost:8000/v1", "http://h:99999/v1", "http://exa mple/v1"):
        c.append(Case(f"workflow-server-base-url-{url}", "error", _wf(hint__backend=SERVER | {"base_url": url}), 2,
                      r"wf\.yaml: hint\.backend\.base_url", check=nothing_ran))
    c += [
        Case("workflow-vllm-tensor-parallel-0", "error", _wf(hint__backend={"backend": "vllm", "options": {"tensor_parallel_size": 0}}),
             2, r"wf\.yaml: hint\.backend\.options\.tensor_parallel_size: must be a whole number >= 1", check=nothing_ran),
        Case("workflow-vllm-memory-1.5", "error", _wf(hint__backend={"backend": "vllm", "options": {"gpu_memory_utilization": 1.5}}),
             2, r"hint\.backend\.options\.gpu_memory_utilization: must be a number in \(0, 1\]", check=nothing_ran),
        Case("workflow-fake-script-missing", "error", _wf(hint__backend={"backend": "fake", "options": {"script": "no_such_mod:f"}}),
             2, r"wf\.yaml: hint\.backend\.options\.script: 'no_such_mod:f': cannot import", check=nothing_ran),
        Case("workflow-policy-timeout", "error",
             _wf(trainer={"kind": "offline", "policy": SERVER | {"options": {"timeout": -5}}}), 2,
             r"wf\.yaml: trainer\.policy\.options\.timeout: must be a number of seconds > 0", check=nothing_ran),
        Case("workflow-vouch-policy-backend-typo", "error", _wf(hint__config__vouch={"policy": {"backend": "vllmm"}}), 2,
             r"wf\.yaml: hint\.config\.vouch\.policy\.backend 'vllmm': choose vllm", check=nothing_ran),
        Case("workflow-vouch-policy-server-without-url", "error",
             _wf(hint__config__vouch={"policy": {"backend": "openai", "model": "m"}}), 2,
             r"hint\.config\.vouch\.policy: backend openai needs base_url", check=nothing_ran),
        Case("workflow-vouch-policy-max-concurrency", "error",
             _wf(hint__config__vouch={"policy": {"backend": "openai", "model": "m",
                                                  "options": {"base_url": "http://127.0.0.1:9/v1", "max_concurrency": -3}}}), 2,
             r"hint\.config\.vouch\.policy\.options\.max_concurrency: must be", check=nothing_ran),
        Case("workflow-vouch-policy-options-a-list", "error",
             _wf(hint__config__vouch={"policy": {"backend": "vllm", "options": {"tensor_parallel_size": "two"}}}), 2,
             r"hint\.config\.vouch\.policy\.options\.tensor_parallel_size: must be a whole number", check=nothing_ran),
        Case("workflow-trl-base-model-no-folder", "error",
             _wf(initial_rollouts=None, trainer={"kind": "trl", "config": {"base_model": "/nonexistent/policy"}}), 2,
             r"wf\.yaml: .*trainer\.config: base_model: no such folder", check=nothing_ran),
        Case("workflow-verl-save-freq-0", "error",
             _wf(trainer={"kind": "verl", "config": {"overrides": {"trainer.save_freq": 0}}}), 2,
             r"wf\.yaml: .*trainer\.config: overrides\.trainer\.save_freq 0: must be > 0", check=nothing_ran),
        Case("workflow-openrlhf-dynamic-filtering", "error",
             _wf(trainer={"kind": "openrlhf", "config": {"base_model": "Qwen/Qwen2.5-0.5B-Instruct",
                                                         "extra_args": {"algo.dynamic_filtering_range": [1, 0]}}}), 2,
             r"wf\.yaml: trainer\.config: extra_args: algo\.dynamic_filtering_range \[1, 0\]", check=nothing_ran),
    ]
    return c


STATUS, TRAIN, WORKFLOW = status_cases(), train_cases(), workflow_cases()


@pytest.mark.parametrize("case", params(STATUS))
def test_status_of_a_damaged_run(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


@pytest.mark.parametrize("case", params(TRAIN))
def test_train_dry_run_refuses_early(case: Case, tmp_path):
    if "verl" in case.id:
        pytest.importorskip("verl")
    if "trl" in case.id:
        pytest.importorskip("trl")
    run_case(case, tmp_path / "case")


@pytest.mark.parametrize("case", params(WORKFLOW))
def test_workflow_checked_before_the_first_stage(case: Case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_case(case, tmp_path / "case")
