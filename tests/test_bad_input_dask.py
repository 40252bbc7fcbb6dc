"""`--scheduler` / `--workers` of `mentor mine`, `hint` and `run` pointed at odd places (real GSM8K rollouts).

An address without a port or with the dashboard's http://, a port where nothing listens, a port
where an HTTP server or a silent socket listens, a dask worker's address, a scheduler without
workers, `--workers` with `--scheduler`: each is one line naming the address and what it is,
within the bound `--scheduler-timeout` sets, with nothing written. A real scheduler with a worker
runs the stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bad_input_lib import Case, params, run_case
from fake_openai_server import FakeServer, SilentPort

distributed = pytest.importorskip("distributed")

_PLACES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def places():
    """A scheduler with no workers, one with a worker (in this process, over TCP), an HTTP server, a silent port."""
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as empty, \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                     dashboard_address=None) as one, FakeServer() as http, SilentPort() as silent:
        _PLACES.update(empty=empty.scheduler_address, one=one.scheduler_address,
                       worker=next(iter(one.scheduler_info["workers"])), http=f"127.0.0.1:{http.port}",
                       silent=f"127.0.0.1:{silent.port}")
        yield


def _mine(where: str | None, *extra: str):
    def make(root: Path) -> list[str]:
        from mentor.data import bundled

        sched = ["--scheduler", _PLACES.get(where, where)] if where is not None else []
        return ["mine", str(bundled("gsm8k_rollouts.parquet")), "--out", str(root / "out"), *sched, *extra]
    return make


def _hint(where: str, *extra: str):
    def make(root: Path) -> list[str]:
        from mentor.data import bundled
        from mentor.stages.mine import MineConfig
        from mine_lib import mine

        mine([str(bundled("gsm8k_rollouts.parquet"))], MineConfig())[0].head(4).write_parquet(root / "c.parquet")
        return ["hint", str(root / "c.parquet"), "--out", str(root / "out"), "--backend", "fake", "--no-progress",
                "--scheduler", _PLACES.get(where, where), *extra]
    return make


FAST = ("--scheduler-timeout", "2")
EXAMPLE = r"give tcp://HOST:8786"


def dask_cases() -> list[Case]:
    return [
        Case("dask-mine-on-a-scheduler-with-a-worker", "handled", _mine("one"), 0),
        Case("dask-no-port", "error", _mine("127.0.0.1"), 2, rf"--scheduler '127\.0\.0\.1': no port .*{EXAMPLE}"),
        Case("dask-http", "error", _mine("http://127.0.0.1:8787"), 2, r"http:// is the dashboard's; a scheduler's address is tcp://"),
        Case("dask-https", "error", _mine("https://dask.example.org"), 2, r"https:// is the dashboard's"),
        Case("dask-unknown-protocol", "error", _mine("udp://127.0.0.1:8786"), 2, r"unknown protocol 'udp'"),
        Case("dask-empty", "error", _mine(""), 2, r"not a dask scheduler address"),
        Case("dask-spaces", "error", _mine(" 127.0.0.1:8786"), 2, r"not a dask scheduler address"),
        Case("dask-port-zero", "error", _mine("tcp://127.0.0.1:0"), 2, r"port is out of range"),
        Case("dask-port-too-big", "error", _mine("tcp://127.0.0.1:99999"), 2, r"port is out of range"),
        Case("dask-nothing-listens", "error", _mine("127.0.0.1:9", *FAST), 2,
             r"--scheduler tcp://127\.0\.0\.1:9: no dask scheduler answers there .*is it running", max_seconds=15),
        Case("dask-an-http-server", "error", _mine("http", *FAST), 2,
             r"something listens there but does not answer as a dask scheduler within 2 s", max_seconds=15),
        Case("dask-a-silent-port", "error", _mine("silent", *FAST), 2,
             r"does not answer as a dask scheduler within 2 s .*--scheduler-timeout", max_seconds=15),
        Case("dask-a-worker", "error", _mine("worker", *FAST), 2, r"that is a dask Worker, not a scheduler", max_seconds=15),
        Case("dask-no-workers", "error", _mine("empty", *FAST), 2,
             r"the scheduler has no workers \(none joined within 2 s\): start engine workers with .*dask worker", max_seconds=15),
        Case("dask-hint-no-workers", "error", _hint("empty", *FAST), 2, r"the scheduler has no workers", max_seconds=15),
        Case("dask-hint-no-port", "error", _hint("localhost"), 2, r"--scheduler 'localhost': no port"),
        Case("dask-workers-and-scheduler", "error", _mine("one", "--workers", "2"), 2,
             r"--workers starts a local cluster and --scheduler joins an existing one: give one of them"),
        Case("dask-hint-workers-and-scheduler", "error", _hint("one", "--workers", "1"), 2, r"give one of them"),
        Case("dask-timeout-zero", "error", _mine("one", "--scheduler-timeout", "0"), 2, r"Invalid value for '--scheduler-timeout'"),
        Case("dask-timeout-nan", "error", _mine("one", "--scheduler-timeout", "nan"), 2, r"Invalid value for '--scheduler-timeout'"),
    ]


def _run_wf(*extra: str):
    def make(root: Path) -> list[str]:
        import yaml

        from test_bad_input_commands import workflow

        (root / "wf.yaml").write_text(yaml.safe_dump(workflow(root)))
        return ["run", str(root / "wf.yaml"), "--run-dir", str(root / "out"), *extra]
    return make


def run_cases() -> list[Case]:
    return [
        Case("dask-run-workers-and-scheduler", "error", _run_wf("--workers", "1", "--scheduler", "127.0.0.1:8786"), 2,
             r"give one of them"),
        Case("dask-run-no-workers", "error", lambda r: _run_wf("--scheduler", _PLACES["empty"], *FAST)(r), 2,
             r"the scheduler has no workers", max_seconds=20),
    ]


@pytest.mark.parametrize("case", params(dask_cases() + run_cases()))
def test_dask_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")
