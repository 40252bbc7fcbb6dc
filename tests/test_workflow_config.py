"""Workflow files: the shipped ones validate; bad keys are named with the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mentor.pipeline.errors import ConfigError
from mentor.workflows.config import PACKAGED, load_workflow

SHIPPED = sorted(PACKAGED.glob("*.yaml"))


def test_required_workflows_are_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"gsm8k-demo", "deepmath-openrlhf", "code-livecodebench-openrlhf"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_workflows_validate(path):
    wf = load_workflow(path)
    assert wf.name and wf.rounds >= 1


def test_packaged_name_resolves():
    assert load_workflow("gsm8k-demo").initial_rollouts is not None


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "wf.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _demo() -> dict:
    return yaml.safe_load((PACKAGED / "gsm8k-demo.yaml").read_text())


def test_unknown_key_named_with_file(tmp_path):
    data = _demo() | {"roundz": 3}
    with pytest.raises(ConfigError, match=r"wf\.yaml: roundz: unknown key"):
        load_workflow(_write(tmp_path, data))


def test_nested_unknown_key(tmp_path):
    data = _demo()
    data["mine"]["k_faild"] = 3
    with pytest.raises(ConfigError, match=r"wf\.yaml: mine\.k_faild: unknown key"):
        load_workflow(_write(tmp_path, data))


def test_section_owned_by_stage_is_validated(tmp_path):
    data = _demo()
    data["hint"]["config"] = {"max_retyr": 2}
    with pytest.raises(ConfigError, match=r"wf\.yaml: hint\.config\.max_retyr: unknown key"):
        load_workflow(_write(tmp_path, data))
    data = _demo()
    data["build"] = {"mode": "sideways"}
    with pytest.raises(ConfigError, match=r"wf\.yaml: build\.mode"):
        load_workflow(_write(tmp_path, data))


def test_bad_trainer_kind(tmp_path):
    data = _demo()
    data["trainer"] = {"kind": "magic"}
    with pytest.raises(ConfigError, match=r"wf\.yaml: trainer"):
        load_workflow(_write(tmp_path, data))


def test_missing_file():
    with pytest.raises(ConfigError, match="no such workflow file"):
        load_workflow("does-not-exist.yaml")


@pytest.mark.parametrize("name", ["deepmath-openrlhf", "code-livecodebench-openrlhf"])
def test_openrlhf_workflows_parse_with_openrlhfs_own_parser(name, tmp_path):
    """The command each shipped OpenRLHF workflow builds for round 1 is accepted by OpenRLHF 0.11.2's parser."""
    pytest.importorskip("openrlhf")
    from mentor.training.openrlhf.check import check_with_openrlhf
    from mentor.training.openrlhf.launcher import TrainConfig, build_command

    wf = load_workflow(name)
    cfg = TrainConfig.model_validate(wf.trainer.config).for_round(1, prompts=str(tmp_path / "p"),
                                                                  round_dir=str(tmp_path / "round-001"), prev_model=str(tmp_path / "m"))
    cmd = build_command(cfg)
    check_with_openrlhf(cmd)
    assert cmd[cmd.index("--actor.model_name_or_path") + 1] == str(tmp_path / "m")


def test_openrlhf_round_after_initial_rollouts_starts_from_base(tmp_path):
    """Round 1 after a round 0 that stood on existing logs (no train/outcome.json) starts from base_model."""
    from mentor.training.openrlhf.launcher import TrainConfig, actor_model

    wf = load_workflow("deepmath-openrlhf")
    cfg = TrainConfig.model_validate(wf.trainer.config).for_round(1, prompts=str(tmp_path / "p"),
                                                                  round_dir=str(tmp_path / "round-001"))
    with pytest.raises(ConfigError, match="round-000/train/outcome.json does not exist"):
        actor_model(cfg)
    cfg = TrainConfig.model_validate(wf.trainer.config).for_round(1, prompts=str(tmp_path / "p"),
                                                                  round_dir=str(tmp_path / "round-001"), start_from_base=True)
    assert actor_model(cfg) == cfg.base_model
