"""GPUs checked before launch: OpenRLHF's own placement code counts, fake device counts stand in for GPUs.

`MENTOR_FAKE_GPUS` sets this machine's GPU count (it has none). The Ray-cluster side
(GPU resources of a real `ray start` head) is in test_ray_logging.py.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("openrlhf", reason="openrlhf is not installed (mentor setup-cpu --openrlhf)")

from mentor.workflows.cli import cli  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.pipeline.rundir import RunDir  # noqa: E402
from mentor.training.gpus import GpuDemand, GpuShortage, GpuSupply, local_gpus  # noqa: E402
from mentor.training.openrlhf.launcher import TrainConfig, build_command  # noqa: E402
from mentor.training.openrlhf.check import check_with_openrlhf  # noqa: E402
from mentor.training.openrlhf.placement import openrlhf_demand, round_demand  # noqa: E402
from mentor.workflows.config import load_workflow, validate_workflow  # noqa: E402
from mentor.workflows.runner import RunOptions, Runner  # noqa: E402

from fake_trainers import fake_trainer  # noqa: E402

pytestmark = pytest.mark.openrlhf
WORKFLOWS = Path(__file__).resolve().parents[1] / "workflows"

FAKE_TRAINER = """out = sys.argv[sys.argv.index("--ckpt.output_dir") + 1]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "started"), "w").write("yes")
"""


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch, tmp_path):
    """No Ray cluster to find: no RAY_ADDRESS, an empty Ray temp dir (so a `ray start` elsewhere on this box is not joined)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray-tmp").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray-tmp"))


@pytest.fixture()
def trainer(tmp_path) -> str:
    return fake_trainer(tmp_path / "fake-trainer", FAKE_TRAINER)


@pytest.fixture()
def inputs(policy_model, gsm8k_prompts) -> dict[str, str]:
    """Rounds that launch measure their prompts with the policy's tokenizer: real prompts and a real tokenizer."""
    return {"base_model": policy_model, "prompts": gsm8k_prompts}


def _demand(**kw):
    cfg = TrainConfig(base_model="m", round_dir="/tmp/mentor-gpu-test/round-000", **kw)
    return openrlhf_demand(check_with_openrlhf(build_command(cfg))[0])


def test_counts_follow_openrlhf_placement():
    d = _demand(actor_gpus_per_node=8, ref_gpus_per_node=8, vllm_num_engines=8)
    assert d.describe() == "24 GPUs (8 actor + 8 reference + 8 vLLM: 8 engines x TP 1)"
    assert d.per_role == {"actor": 8, "reference": 8, "vLLM": 8}

    colocated = _demand(actor_gpus_per_node=8, ref_gpus_per_node=8, vllm_num_engines=8, extra_args={"train.colocate_all": True})
    assert colocated.total == 8 and colocated.groups[0].roles == ("actor", "reference", "vLLM")

    # Actor and reference in one placement group; the engines (TP 2) in their own.
    d = _demand(actor_gpus_per_node=4, ref_gpus_per_node=4, vllm_num_engines=2, vllm_tensor_parallel_size=2,
                extra_args={"train.colocate_actor_ref": True})
    assert d.describe() == "8 GPUs (4 shared by actor, reference: colocated + 4 vLLM: 2 engines x TP 2)"

    # No KL term: OpenRLHF builds no reference model.
    assert _demand(actor_gpus_per_node=8, ref_gpus_per_node=8, vllm_num_engines=8,
                   extra_args={"algo.kl.init_coef": 0}).per_role == {"actor": 8, "vLLM": 8}

    # gae: OpenRLHF adds a critic with its parser's default of 8 GPUs per node.
    assert _demand(actor_gpus_per_node=2, ref_gpus_per_node=2, vllm_num_engines=2,
                   advantage_estimator="gae").per_role == {"actor": 2, "reference": 2, "critic": 8, "vLLM": 2}

    # colocate_all with engines x TP != actor GPUs: OpenRLHF's own assertion, before anything starts.
    with pytest.raises(ConfigError, match="must be equal to vllm_num_engines"):
        _demand(actor_gpus_per_node=8, ref_gpus_per_node=8, vllm_num_engines=4, extra_args={"train.colocate_all": True})


def _round_yaml(tmp_path: Path, trainer: str, inputs: dict[str, str], **kw) -> Path:
    conf = {"round": 0, "round_dir": str(tmp_path / "run" / "round-000"), "python": trainer, **inputs,
            "actor_gpus_per_node": 8, "ref_gpus_per_node": 8, "vllm_num_engines": 8, **kw}
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def test_train_refuses_a_round_the_machine_cannot_place(tmp_path, trainer, monkeypatch, inputs):
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "8")
    res = CliRunner().invoke(cli, ["train", "--config", str(_round_yaml(tmp_path, trainer, inputs))])
    assert res.exit_code == 2
    msg = res.output.strip().removeprefix("Error: ")
    assert msg == (
        "this round needs 24 GPUs (8 actor + 8 reference + 8 vLLM: 8 engines x TP 1), this machine (MENTOR_FAKE_GPUS=8) "
        "has 8: set extra_args 'train.colocate_all': true (then it needs 8) or run it on a Ray cluster of 3 nodes "
        "with 8 GPUs each (`ray start` on each, RAY_ADDRESS set)"
    )
    assert not (tmp_path / "run" / "round-000" / "train").exists()  # the trainer never started

    # The fix the message names: the same round colocated fits on the 8 GPUs and launches.
    res = CliRunner().invoke(cli, ["train", "--config", str(_round_yaml(tmp_path, trainer, inputs, extra_args={"train.colocate_all": True}))])
    assert res.exit_code == 0, res.output
    outcome = json.loads((tmp_path / "run" / "round-000" / "train" / "outcome.json").read_text())
    assert (tmp_path / "run" / "round-000" / "train" / "model" / "started").exists()
    assert outcome["preflight"]["gpus_needed"] == 8 and outcome["preflight"]["gpus_there"] == 8
    assert outcome["preflight"]["ray_cluster"] is None  # no cluster: OpenRLHF's ray.init() starts a local one


def test_dry_run_prints_the_gpus_on_a_machine_without_any(tmp_path, trainer, monkeypatch, inputs):
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "0")  # a login node
    res = CliRunner().invoke(cli, ["train", "--config", str(_round_yaml(tmp_path, trainer, inputs)), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "# GPUs: this round needs 24 GPUs (8 actor + 8 reference + 8 vLLM: 8 engines x TP 1)" in res.output
    assert "#   or with extra_args 'train.colocate_all': true: 8" in res.output
    assert "#   or with extra_args 'train.colocate_actor_ref': true: 16" in res.output
    res = CliRunner().invoke(cli, ["train", "--config", str(_round_yaml(tmp_path, trainer, inputs))])
    assert res.exit_code == 2 and "this machine (MENTOR_FAKE_GPUS=0) has 0" in res.output


def _shipped(name: str, tmp_path: Path) -> TrainConfig:
    wf = load_workflow(WORKFLOWS / name)
    return TrainConfig.model_validate(wf.trainer.config | {"round_dir": str(tmp_path / name / "round-000")})


def test_shipped_workflows_say_their_cluster_and_one_fits_a_single_node(tmp_path):
    deepmath = round_demand(build_command(_shipped("deepmath-openrlhf.yaml", tmp_path)))
    assert deepmath.total == 8 and set(deepmath.groups[0].roles) == {"actor", "reference", "vLLM"}
    deepmath.check(GpuSupply(8, "one node", [8]))
    lcb = round_demand(build_command(_shipped("code-livecodebench-openrlhf.yaml", tmp_path)))
    assert lcb.total == 16
    lcb.check(GpuSupply(16, "the Ray cluster at head:6379", [8, 8]))
    with pytest.raises(GpuShortage, match=r"needs 16 GPUs .* has 8: set extra_args 'train.colocate_all': true \(then it needs 8\)"):
        lcb.check(GpuSupply(8, "one node", [8]))
    for name in ("deepmath-openrlhf.yaml", "code-livecodebench-openrlhf.yaml"):
        assert "# Cluster:" in (WORKFLOWS / name).read_text()


def test_run_refuses_at_round_start(tmp_path, trainer, monkeypatch, inputs):
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "4")
    wf = yaml.safe_load((WORKFLOWS / "deepmath-openrlhf.yaml").read_text())
    wf.update(name="gpu-check", base="gsm8k", base_map={}, rounds=1, hint={"backend": {"backend": "fake"}})
    wf["trainer"]["config"]["python"] = trainer
    wf["trainer"]["config"]["base_model"] = inputs["base_model"]  # a tokenizer here: the launcher measures the prompts
    run_dir = tmp_path / "run"
    with pytest.raises(GpuShortage, match=r"this round needs 8 GPUs \(8 shared by actor, reference, vLLM: .*has 4"):
        Runner(validate_workflow(wf), run_dir, RunOptions(progress=False)).run()
    train = RunDir(run_dir).stage(0, "train")
    assert train.state() == "failed" and "needs 8 GPUs" in train.last_error()
    assert not (train.path / "model").exists()  # the trainer never started
    res = CliRunner().invoke(cli, ["status", str(run_dir)])
    assert "needs 8 GPUs" in res.output


def test_demand_records_for_other_trainers():
    # verl: one resource pool of n_gpus_per_node on each of nnodes, actor/rollout/reference colocated.
    verl = GpuDemand.of_roles("verl", {"actor": 16, "rollout": 16, "reference": 16}, nodes=2, per_node=8, shared=True,
                              detail="trainer.nnodes 2 x trainer.n_gpus_per_node 8", fixes=[("trainer.nnodes 1", 8)])
    assert verl.describe() == "16 GPUs (16 shared by actor, rollout, reference: trainer.nnodes 2 x trainer.n_gpus_per_node 8)"
    verl.check(GpuSupply(16, "the Ray cluster at h:6379", [8, 8]))
    with pytest.raises(GpuShortage, match=r"needs 2 nodes with 8 GPUs each .* \(0 with 8 or more\)"):
        verl.check(GpuSupply(16, "the Ray cluster at h:6379", [4, 4, 4, 4]))
    with pytest.raises(GpuShortage, match=r"has 8: set trainer.nnodes 1 \(then it needs 8\)"):
        verl.check(GpuSupply(8, "the Ray cluster at h:6379", [8]))
    trl = GpuDemand.of_roles("trl", {"training processes": 4, "vLLM server": 2})
    assert trl.total == 6 and trl.describe() == "6 GPUs (4 training processes + 2 vLLM server)"


def test_fake_gpu_count_is_checked(monkeypatch):
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "eight")
    with pytest.raises(ConfigError, match=r"MENTOR_FAKE_GPUS='eight': expected a number"):
        local_gpus()
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "2")
    assert local_gpus().total == 2
    monkeypatch.delenv("MENTOR_FAKE_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # what a local Ray cluster would see
    assert local_gpus().total == 4 and "CUDA_VISIBLE_DEVICES" in local_gpus().where
