"""Round configs, workflows with the train stage, `inspect`, `status` and `check-judge` over the bad inputs of
issue 59 (real GSM8K data, fake hint model; the trainers' own config code where it is installed).

Each case fails on the code before the fix: a traceback (a list as `kind`, a text file as `prompts`, a folder as
`reward_file`, a broken placeholder found only when the round runs, a damaged manifest), a silent wrong result
(an empty `base_model` training the embedded model, a weights file read as a hub name, `max_steps: ten` and
`trainer.total_epochs: one` passing the dry run, seeds past their range wrapping onto others, an unlisted shard
counted as the build's), or an unclear error (a day-long wait that says nothing, `actor_model` not resolved like
`base_model`, "check the disk" for a closed pipe, "File exists" for `--out` under a file, rescue arms dropped).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml

from bad_input_lib import Case, invoke, params, run_case
from test_bad_input_commands import COLLAPSED, nothing_ran
from test_bad_input_runs import _prompts, _round, _wf

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"

# --------------------------------------------------------------------------- round configs (mentor train --dry-run)


def _file(root: Path, name: str, text: str = "x") -> Path:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    return root / name


def round_cases() -> list[Case]:
    c = [
        Case("round-kind-a-list", "error", lambda r: _round(r, kind=["verl"]), 2,
             r"round\.yaml: kind \['verl'\]: give one of openrlhf, trl, verl"),
        Case("round-kind-a-mapping", "error", lambda r: _round(r, kind={"name": "verl"}), 2,
             r"round\.yaml: kind \{'name': 'verl'\}: give one of"),
        Case("round-openrlhf-prompts-a-text-file", "error",
             lambda r: _round(r, base_model=QWEN, prompts=str(_file(r, "notes.txt"))), 2,
             r"round\.yaml: prompts: .*notes\.txt is not a Parquet shard: give `mentor build`'s output folder"),
        Case("round-openrlhf-reward-file-a-folder", "error",
             lambda r: (r / "rewards").mkdir() or _round(r, base_model=QWEN, reward_file=str(r / "rewards")), 2,
             r"round\.yaml: reward_file: is a folder, not a Python file"),
        Case("round-openrlhf-reward-file-missing", "error",
             lambda r: _round(r, base_model=QWEN, reward_file=str(r / "nope.py")), 2,
             r"round\.yaml: reward_file: no such file"),
        Case("round-openrlhf-base-model-empty", "error", lambda r: _round(r, base_model=""), 2,
             r"round\.yaml: base_model: empty: give a model folder .* or a Hugging Face name"),
        Case("round-openrlhf-base-model-weights-name", "error", lambda r: _round(r, base_model="model.safetensors"), 2,
             r"round\.yaml: base_model: names a weights file: give the folder that holds it"),
    ]
    for kind in ("verl", "trl"):
        c += [
            Case(f"round-{kind}-base-model-empty", "error", lambda r, k=kind: _round(r, kind=k, base_model=""), 2,
                 r"round\.yaml: base_model: empty"),
            Case(f"round-{kind}-prompts-a-text-file", "error",
                 lambda r, k=kind: _round(r, kind=k, prompts=str(_file(r, "prompts.jsonl"))), 2,
                 r"round\.yaml: prompts: .*prompts\.jsonl is not a Parquet shard"),
        ]
    c += [
        Case("round-verl-reward-file-a-folder", "error",
             lambda r: (r / "rewards").mkdir() or _round(r, kind="verl", reward_file=str(r / "rewards")), 2,
             r"round\.yaml: reward_file: is a folder, not a Python file"),
        Case("round-verl-actor-model-a-weights-file", "error",
             lambda r: _round(r, kind="verl", actor_model=str(_file(r, "ckpt/model.safetensors"))), 2,
             r"round\.yaml: actor_model: is a file, not a model folder"),
        Case("round-verl-override-not-a-number", "error",
             lambda r: _round(r, kind="verl", overrides={"trainer.total_epochs": "one"}), 2,
             r"round\.yaml: overrides\.trainer\.total_epochs 'one': must be a whole number \(verl's default is 30\)"),
        Case("round-verl-override-not-a-bool", "error",
             lambda r: _round(r, kind="verl", overrides={"actor_rollout_ref.model.use_remove_padding": "sometimes"}), 2,
             r"overrides\.actor_rollout_ref\.model\.use_remove_padding 'sometimes': must be true or false"),
        Case("round-verl-override-a-number-ok", "handled",
             lambda r: _prompts(r) and _round(r, kind="verl", overrides={"actor_rollout_ref.actor.optim.lr": "2e-6",
                                                                           "trainer.total_epochs": 2}), 0),
        Case("round-trl-max-steps-not-a-number", "error", lambda r: _round(r, kind="trl", max_steps="ten"), 2,
             r"round\.yaml: max_steps 'ten': must be int \(TRL .*GRPOConfig\.max_steps\)"),
        Case("round-trl-learning-rate-as-text", "error", lambda r: _round(r, kind="trl", learning_rate="1e-6"), 2,
             r"learning_rate '1e-6': must be float .*YAML read it as text"),
        Case("round-trl-seed-past-numpy", "error", lambda r: _round(r, kind="trl", seed=2**32 + 5), 2,
             r"round\.yaml: seed 4294967301: must be 0 to 4294967295"),
    ]
    return c


ROUND = round_cases()


@pytest.mark.parametrize("case", params(ROUND))
def test_round_config_refused_when_read(case: Case, tmp_path, monkeypatch):
    for kind in ("verl", "trl", "openrlhf"):
        if f"-{kind}-" in case.id:
            pytest.importorskip(kind)
    monkeypatch.chdir(tmp_path)
    run_case(case, tmp_path / "case")


def test_weights_file_in_the_working_folder_is_not_a_hub_name(tmp_path, monkeypatch):
    """`base_model: model.safetensors` next to the round: a file, not a model (before: passed on as a hub name)."""
    from mentor.pipeline.errors import ConfigError
    from mentor.training.openrlhf.launcher import parse_config

    monkeypatch.chdir(tmp_path)
    _file(tmp_path, "model.safetensors")
    with pytest.raises(ConfigError, match=r"base_model: is a file, not a model folder .*\(found: 'model\.safetensors'\)"):
        parse_config({"base_model": "model.safetensors", "round_dir": str(tmp_path / "round-000")}, "round.yaml")


def test_actor_model_cpu_name_resolves_like_base_model(tmp_path):
    """A CPU model name as actor_model starts the round from the folder setup-cpu made, as base_model does
    (before: the bare name reached the trainer, which asked the model hub for it)."""
    from mentor.pipeline.models import EMBEDDED_ALIAS, resolve_model
    from mentor.training.launcher import RoundConfig

    cfg = RoundConfig(round=2, round_dir=str(tmp_path / "round-002"), actor_model=EMBEDDED_ALIAS)
    got = cfg.start_model()
    assert got == resolve_model(EMBEDDED_ALIAS) and Path(got).is_dir() and (Path(got) / "config.json").is_file()
    assert RoundConfig(round=0, round_dir=str(tmp_path / "r"), base_model=EMBEDDED_ALIAS).start_model() == got


# --------------------------------------------------------------------------- workflows: checked when loaded


VERL_CMD = "python3 -m verl.trainer.main_ppo data.train_files={prompts} trainer.default_local_dir={run_dir}/ckpt"


def workflow_cases() -> list[Case]:
    c = []
    for label, command, why in [
        ("unknown-placeholder", VERL_CMD.replace("{prompts}", "{prompt}"), r"unknown placeholder \{prompt\}; use \{prompts\}"),
        ("malformed-placeholder", VERL_CMD.replace("{prompts}", "{prompts"), r"malformed placeholder"),
        ("attribute-placeholder", VERL_CMD.replace("{prompts}", "{round.real}"), r"unknown placeholder \{round\.real\}"),
        ("empty-command", "", r"empty: give the launch"),
        ("empty-list", [], r"empty: give the launch"),
        ("unclosed-quote", "python3 -m verl.trainer.main_ppo 'x", r"not a command line \(No closing quotation\)"),
    ]:
        c.append(Case(f"workflow-verl-command-{label}", "error", _wf(trainer={"kind": "verl", "command": command}), 2,
                      rf"wf\.yaml: trainer\.verl\.command: .*{why}", check=nothing_ran))
    c += [
        Case("workflow-verl-model-out-placeholder", "error",
             _wf(trainer={"kind": "verl", "command": VERL_CMD, "model_out": "{run_dir}/{rnd}/model"}), 2,
             r"wf\.yaml: trainer\.verl\.model_out: .*unknown placeholder \{rnd\}", check=nothing_ran),
        Case("workflow-external-rollouts-unknown-placeholder", "error",
             _wf(trainer={"kind": "external", "rollouts": "{run_dir}/logs/{rond}/*.jsonl"}), 2,
             r"wf\.yaml: trainer\.external\.rollouts: .*unknown placeholder \{rond\}; use \{round\}, \{run_dir\}",
             check=nothing_ran),
        Case("workflow-external-rollouts-malformed", "error",
             _wf(trainer={"kind": "external", "rollouts": "{run_dir/logs/*.jsonl"}), 2,
             r"wf\.yaml: trainer\.external\.rollouts: .*malformed placeholder", check=nothing_ran),
        Case("workflow-external-sentinel-placeholder", "error",
             _wf(trainer={"kind": "external", "rollouts": "{run_dir}/*.jsonl", "sentinel": "{prompts}/DONE"}), 2,
             r"wf\.yaml: trainer\.external\.sentinel: .*unknown placeholder \{prompts\}", check=nothing_ran),
        Case("workflow-trl-base-model-empty", "error",
             _wf(initial_rollouts=None, trainer={"kind": "trl", "config": {"base_model": ""}}), 2,
             r"wf\.yaml: trainer\.config: base_model: empty", check=nothing_ran),
        Case("workflow-offline-seed-wraps-in-round-2", "error",
             _wf(rounds=3, trainer={"kind": "offline", "rollout": {"seed": 2**31 - 1500}}), 2,
             r"wf\.yaml: trainer\.rollout\.seed 2147482148: round 2 would sample with seed 2147484148 .*pick a seed of at most",
             check=nothing_ran),
        Case("workflow-offline-seed-past-range", "error", _wf(trainer={"kind": "offline", "rollout": {"seed": 2**40}}), 2,
             r"wf\.yaml: trainer\.offline\.rollout\.seed: Input should be less than or equal to 2147483646", check=nothing_ran),
    ]
    return c


WORKFLOW = workflow_cases()


@pytest.mark.parametrize("case", params(WORKFLOW))
def test_workflow_refused_before_the_first_stage(case: Case, tmp_path, monkeypatch):
    if "trl" in case.id:
        pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)
    run_case(case, tmp_path / "case")


# --------------------------------------------------------------------------- seeds on the command line


def seed_cases() -> list[Case]:
    return [
        Case("rollout-seed-wraps", "error",
             lambda r: ["rollout", "gsm8k", "--backend", "fake", "--out", str(r / "out"), "--seed", str(2**31 - 1)], 2,
             r"--seed.*2147483647 is not in the range 0<=x<=2147483646"),
        Case("rollout-seed-negative", "error",
             lambda r: ["rollout", "gsm8k", "--backend", "fake", "--out", str(r / "out"), "--seed", "-4"], 2, r"--seed"),
        Case("build-seed-wraps", "error",
             lambda r: ["build", "--base", "gsm8k", "--out", str(r / "out"), "--seed", str(2**64 + 7)], 2,
             r"--seed.*18446744073709551623 is not in the range"),
    ]


@pytest.mark.parametrize("case", params(seed_cases()))
def test_seed_past_its_range_refused(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


# --------------------------------------------------------------------------- external trainer: the wait speaks


def test_external_wait_says_what_it_waits_for(tmp_path, monkeypatch, caplog):
    """The wait names the glob and the sentinel when it starts and while it lasts (before: silent for up to a day)."""
    import mentor.stages.train as train_mod
    from mentor.pipeline.errors import DataError
    from mentor.stages.train import TRAIN, ExternalTrainer, TrainConfig

    monkeypatch.setattr(train_mod, "WAIT_REPORT_S", 0.05)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    pl.DataFrame({"x": [1]}).write_parquet(run / "logs" / "r0.parquet")
    trainer = ExternalTrainer(kind="external", rollouts="{run_dir}/logs/*.parquet", sentinel="{run_dir}/DONE-{round}",
                              timeout_s=0.4, poll_s=0.05)
    caplog.set_level(logging.INFO, logger="mentor.stages.train")
    with pytest.raises(DataError, match=r"waiting for .*DONE-0"):
        TRAIN({"run_dir": str(run)}, TrainConfig(round=0, trainer=trainer), run / "round-000" / "train")
    text = caplog.text
    assert f"waiting up to 0.4s for the external trainer's rollout logs {run}/logs/*.parquet, complete once {run}/DONE-0 appears" in text
    assert "still waiting" in text and "1 file(s) match" in text and f"{run}/DONE-0 is not there yet" in text


# --------------------------------------------------------------------------- inspect


@pytest.fixture(scope="module")
def prompts_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prompts") / "p"
    res = invoke(["build", "--base", "gsm8k", "--out", str(out), "--shard-rows", "1000"])
    assert res.exit_code == 0, res.output
    return out


def _inspect_json(path: Path) -> dict:
    res = invoke(["inspect", str(path), "--format", "json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _edit_manifest(folder: Path, fn) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(fn(m)))


def test_inspect_names_a_shard_the_manifest_does_not_list(prompts_dir, tmp_path):
    ok = _inspect_json(prompts_dir)
    assert ok["rows"] == 1319 and ok["manifest"]["verified"] is True and ok["manifest"]["unlisted"] == []
    d = tmp_path / "p"
    shutil.copytree(prompts_dir, d)
    shutil.copy(d / "part-00000.parquet", d / "part-00007.parquet")  # a stray copy: the same rows again
    got = _inspect_json(d)
    assert got["manifest"]["verified"] is False and got["manifest"]["unlisted"] == ["part-00007.parquet"]
    assert "part-00007.parquet: in the folder but not in its manifest" in got["manifest"]["problem"]
    assert got["rows"] == 1319 and [s["file"] for s in got["shards"]] == ["part-00000.parquet", "part-00001.parquet"]
    table = invoke(["inspect", str(d)]).output
    assert "verified    false" in table and "part-00007.parquet" in table


@pytest.mark.parametrize("damage", ["shard-without-path", "list-at-the-top", "shards-a-mapping"])
def test_inspect_of_a_damaged_manifest(prompts_dir, tmp_path, damage):
    d = tmp_path / "p"
    shutil.copytree(prompts_dir, d)
    edit = {"shard-without-path": lambda m: m | {"shards": [{k: v for k, v in m["shards"][0].items() if k != "path"},
                                                            *m["shards"][1:]]},
            "list-at-the-top": lambda m: m["shards"],
            "shards-a-mapping": lambda m: m | {"shards": {"part-00000.parquet": "x"}}}[damage]
    _edit_manifest(d, edit)
    got = _inspect_json(d)
    assert got["manifest"]["verified"] is False and "rebuild with `mentor build`" in got["manifest"]["problem"]
    assert got["rows"] == 1319
    assert invoke(["inspect", str(d)]).exit_code == 0


def _hints(problem_ids: list[str], n: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"problem_id": pid, "round": 0, "hint_id": f"h-{i}", "hint": "Work out each step's quantity before combining them.",
         "keywords": ["steps"], "status": "accepted", "retries": 0, "refines": 0, "violations": [], "trace": [],
         "model": "fake", "prompt_version": "t", "config_hash": "c"} for i, pid in enumerate(problem_ids[:n])])


def test_inspect_of_a_rescue_shows_every_arm(tmp_path):
    from mentor.pipeline.io import write_parquet_atomic

    ids = COLLAPSED["problem_id"].to_list()
    COLLAPSED.write_parquet(tmp_path / "c.parquet")
    write_parquet_atomic(_hints(ids, 4), tmp_path / "a.parquet", dataset="hints")
    write_parquet_atomic(_hints(ids, 4), tmp_path / "b.parquet", dataset="hints")
    res = invoke(["rescue", "--collapsed", str(tmp_path / "c.parquet"), "--arm", f"full={tmp_path / 'a.parquet'}",
                  "--arm", f"generic={tmp_path / 'b.parquet'}", "--backend", "fake", "--k", "1", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    got = _inspect_json(tmp_path / "r")
    arms = {a["arm"]: a for a in got["arms"]}
    assert set(arms) == {"unhinted", "full", "generic"}
    assert all(a["rescued"] is not None and a["rescue_rate"] is not None and len(a["rescue_rate_ci95"]) == 2 for a in arms.values())
    assert "note" not in got
    table = invoke(["inspect", str(tmp_path / "r")]).output
    assert "full" in table and "generic" in table


# --------------------------------------------------------------------------- status, check-judge


def test_status_into_a_closed_pipe_ends_quietly(tmp_path):
    """`mentor status RUN | head`: the reader goes away; no "check the disk", no traceback."""
    from test_bad_input_commands import workflow

    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(workflow(tmp_path)))
    assert invoke(["run", str(tmp_path / "wf.yaml"), "--run-dir", str(tmp_path / "run")]).exit_code == 0
    proc = subprocess.Popen([sys.executable, "-m", "mentor.workflows.cli", "status", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # closed before mentor writes its table (its imports take a while)
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert err == "", err
    assert proc.returncode == 1


def test_check_judge_out_under_a_file(tmp_path):
    """`--out notes.txt/report.json`: refused before the judge runs, naming the file in the way (before: "File exists")."""
    COLLAPSED.write_parquet(tmp_path / "c.parquet")
    (tmp_path / "notes.txt").write_text("x")
    res = invoke(["check-judge", str(tmp_path / "c.parquet"), "--backend", "fake", "--out", str(tmp_path / "notes.txt" / "r.json")])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, res.output
    assert "notes.txt is a file, not a folder; pass a path in a folder" in res.output and "File exists" not in res.output
    assert (tmp_path / "notes.txt").read_text() == "x"
