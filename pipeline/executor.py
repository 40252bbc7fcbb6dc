"""Where a stage's shard tasks run: in this process, or on a dask.distributed cluster.

A stage maps a top-level (picklable) function over its shards with
``executor.map(fn, items, *args)`` (all results, in item order) or
``executor.imap(...)`` (results one at a time, in item order, so the caller can
write each as it comes and hold only a few). `fn(item, *args)` is the same call
either way; the stage does not know where it runs.

- `LocalExecutor` runs the tasks here, one after the other: polars and pyarrow
  already use every core within a task.
- `DaskExecutor` runs them as dask tasks (``--workers N`` starts a local cluster
  of N engine workers, ``--scheduler ADDRESS`` joins one). A worker keeps its
  engine across the shards it runs; `close_engines` stops them all when the
  stage ends.

Retries. A task that raised is not run again (``retries=0``): mentor's tasks
raise for reasons a second run does not change (bad data, a config, an engine
that died on this batch, which is closed and would only be rebuilt to fail the
same way), and a shard that failed is resumable: the rerun redoes it. A task
whose worker process was lost (killed, out of memory, a node gone) is dask's
business: the scheduler runs it on another worker, up to
``distributed.scheduler.allowed-failures`` (3) times, then reports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

from mentor.pipeline.devices import check_engine_devices, engine_worker_env, worker_info
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import close_backends

log = logging.getLogger(__name__)


class Executor(Protocol):
    def map(self, fn: Callable, items: Iterable, *args: Any) -> list: ...

    def imap(self, fn: Callable, items: Iterable, *args: Any) -> Iterator: ...

    def workers(self) -> int:
        """How many tasks run at once (engine workers on dask, 1 in this process)."""

    def close_engines(self) -> None: ...


class LocalExecutor:
    """Each task in this process, in order."""

    def map(self, fn: Callable, items: Iterable, *args: Any) -> list:
        return [fn(item, *args) for item in items]

    def imap(self, fn: Callable, items: Iterable, *args: Any) -> Iterator:
        for item in items:
            yield fn(item, *args)

    def workers(self) -> int:
        return 1

    def close_engines(self) -> None:
        close_backends()

    def __repr__(self) -> str:
        return "LocalExecutor()"


# This process: the executor of every function that maps tasks unless it is given another (it holds no state).
LOCAL = LocalExecutor()


class DaskExecutor:
    """Each task on a dask.distributed cluster (results in item order).

    `resources` (e.g. ``{"GPU": 1}``) makes each task need that much of a worker
    resource: on a GPU cluster started with ``dask worker --resources GPU=1`` one
    hint shard runs per GPU and each worker owns one engine. `imap` keeps at most
    `window` tasks submitted ahead of the one being consumed.
    """

    def __init__(self, client: Any, retries: int = 0, resources: dict[str, float] | None = None, window: int = 8) -> None:
        self.client = client
        self.retries = retries
        self.resources = resources
        self.window = max(1, window)

    def _args(self, args: tuple) -> list:
        # Large arguments (e.g. the collapsed ids every shard task needs) travel once per worker.
        return [self.client.scatter(a, broadcast=True) if _large(a) else a for a in args]

    def _submit(self, fn: Callable, item: Any, args: list):
        return self.client.submit(fn, item, *args, retries=self.retries, pure=False, resources=self.resources)

    def map(self, fn: Callable, items: Iterable, *args: Any) -> list:
        items = list(items)
        if not items:
            return []
        shipped = self._args(args)
        return self.client.gather([self._submit(fn, item, shipped) for item in items])

    def imap(self, fn: Callable, items: Iterable, *args: Any) -> Iterator:
        todo = iter(items)
        shipped: list | None = None
        pending: deque = deque()
        while True:
            while len(pending) < self.window:
                item = next(todo, _END)
                if item is _END:
                    break
                if shipped is None:
                    shipped = self._args(args)
                pending.append(self._submit(fn, item, shipped))
            if not pending:
                return
            yield pending.popleft().result()

    def workers(self) -> int:
        """The cluster's workers now (one engine each on an engine cluster)."""
        try:
            info = self.client.scheduler_info(n_workers=-1)  # newer dask lists only 5 workers by default
        except TypeError:  # dask before 2025: every worker, no argument
            info = self.client.scheduler_info()
        return max(1, len(info.get("workers", {})))

    def close_engines(self) -> None:
        """Stop the engines every worker keeps (`mentor.pipeline.llm.close_backends` on each)."""
        try:
            self.client.run(close_backends)
        except Exception as exc:  # a worker that is gone has no engine left to close
            log.warning("could not reach every dask worker to stop its engine: %s", exc)

    def __repr__(self) -> str:
        return f"DaskExecutor({self.client!r})"


_END = object()


def _large(obj: Any) -> bool:
    try:
        return len(obj) > 10_000
    except TypeError:
        return False


def _distributed():
    try:
        import distributed  # optional: the dask extra
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("dask.distributed is not installed; pip install 'mentor[dask]'") from exc
    return distributed


SCHEDULER_TIMEOUT = 30.0  # seconds: reaching a scheduler, and waiting for its first worker
_EXAMPLE = "tcp://HOST:8786 (the scheduler's port, not the dashboard's http:// one, usually 8787)"


def scheduler_address(address: str) -> str:
    """``tcp://HOST:PORT`` for a ``--scheduler`` value (``HOST:PORT`` allowed), or a `ConfigError` saying what is wrong."""
    from distributed.comm.addressing import parse_address, parse_host_port  # optional: the dask extra

    given = f"--scheduler {address!r}"
    if not address.strip() or address != address.strip():
        raise ConfigError(f"{given}: not a dask scheduler address; give {_EXAMPLE}")
    try:
        scheme, loc = parse_address(address)
    except ValueError as exc:
        raise ConfigError(f"{given}: not a dask scheduler address ({exc}); give {_EXAMPLE}") from exc
    if scheme in ("http", "https"):
        raise ConfigError(f"{given}: {scheme}:// is the dashboard's; a scheduler's address is {_EXAMPLE}")
    if scheme not in ("tcp", "tls", "ws", "wss", "ucx"):
        raise ConfigError(f"{given}: unknown protocol {scheme!r}; give {_EXAMPLE}")
    try:
        host, port = parse_host_port(loc)
    except ValueError as exc:
        raise ConfigError(f"{given}: no port ({exc}); give {_EXAMPLE}") from exc
    if not host or not 0 < int(port) < 65536:
        raise ConfigError(f"{given}: no host, or the port is out of range; give {_EXAMPLE}")
    return f"{scheme}://{loc}"


def _identity(address: str, timeout: float) -> dict:
    """What the process at `address` says it is (dask's ``identity`` call), within `timeout` seconds in all.

    distributed's own connect waits for the peer's handshake without a deadline (a port
    that accepts and stays silent hangs it forever); here every step has one.
    """
    from distributed.comm import connect  # optional: the dask extra

    async def ask() -> dict:
        comm = await connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> dict:
        # dask's connect gives up after `timeout` when nothing listens; the margin lets it say so itself.
        return await asyncio.wait_for(ask(), timeout * 1.5 + 1)

    with ThreadPoolExecutor(1) as pool:  # a fresh event loop, also where one is running (a notebook)
        return pool.submit(asyncio.run, bounded()).result()


def connect_scheduler(address: str, timeout: float = SCHEDULER_TIMEOUT) -> Any:
    """A Client of the dask scheduler at `address` that has at least one worker; each wait bounded by `timeout`.

    Every way this goes wrong is one `ConfigError` naming the address: not an address, nothing
    listening, something that is not a dask scheduler (a dashboard, a worker, any other server),
    a scheduler without workers.
    """
    distributed = _distributed()
    address = scheduler_address(address)
    fix = f"raise --scheduler-timeout (now {timeout:g} s) if it is only slow"
    try:
        ident = _identity(address, timeout)
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise ConfigError(f"--scheduler {address}: something listens there but does not answer as a dask scheduler within "
                          f"{timeout:g} s (is it the dashboard's port, or another server?); {fix}") from exc
    except OSError as exc:  # nothing listens (dask's connect retried until the timeout), or it hung up
        raise ConfigError(f"--scheduler {address}: no dask scheduler answers there ({' '.join(str(exc).split())[:200]}); "
                          f"is it running (`dask scheduler`), and is the address right? {fix}") from exc
    except Exception as exc:  # it answered, but not in dask's protocol
        raise ConfigError(f"--scheduler {address}: what answers there is not a dask scheduler ({type(exc).__name__}); "
                          f"give {_EXAMPLE}") from exc
    kind = ident.get("type") if isinstance(ident, dict) else None
    if kind != "Scheduler":
        raise ConfigError(f"--scheduler {address}: that is a dask {kind or 'peer'}, not a scheduler; give the scheduler's "
                          f"address: {_EXAMPLE}")
    client = distributed.Client(address, timeout=timeout)
    try:
        client.wait_for_workers(1, timeout=timeout)
    except BaseException as exc:
        client.close()
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            raise ConfigError(f"--scheduler {address}: the scheduler has no workers (none joined within {timeout:g} s): start "
                              f"engine workers with `DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker {address} --nthreads 1` "
                              f"(docs/gpus.md), or {fix}") from exc
        raise
    return client


_WORKER_FIX = "start each engine worker as `DASK_DISTRIBUTED__WORKER__DAEMON=False dask worker ADDRESS --nthreads 1`" \
              " with CUDA_VISIBLE_DEVICES set to GPUs of its own (docs/gpus.md)"


def check_engine_workers(client: Any, gpus_per_worker: int = 1) -> int:
    """Before the first shard: every worker of a cluster mentor did not start can run one engine at a time.

    A worker with several threads runs several shards at once, on one cached engine (the engine takes
    one batch at a time: the shards wait for each other) or, for two configurations, two engines on the same
    devices; a daemonic worker cannot start vLLM's EngineCore; an engine needs `gpus_per_worker` (its
    tensor_parallel_size) GPUs of the worker's own, and two workers on one host must not share a GPU.
    Every problem is one `ConfigError` naming the workers. Returns the number of workers checked.
    """
    try:
        info = client.scheduler_info(n_workers=-1)  # newer dask lists only 5 workers by default
    except TypeError:  # dask before 2025: every worker, no argument
        info = client.scheduler_info()
    workers = info.get("workers", {})
    seen = client.run(worker_info)
    problems: list[str] = []
    threads = {a: w.get("nthreads", 1) for a, w in workers.items() if w.get("nthreads", 1) > 1}
    for address, n in sorted(threads.items()):
        problems.append(f"worker {address} has {n} threads: it would run {n} shards at once, one engine between them")
    by_host: dict[tuple[str, str], list[str]] = {}
    for address, view in sorted(seen.items()):
        if view.get("daemon"):
            problems.append(f"worker {address} is a daemonic process and cannot start vLLM's EngineCore")
        if view.get("gpu_error"):
            problems.append(f"worker {address}: {view['gpu_error']}")
            continue
        gpus = view.get("gpus") or []
        if gpus and len(gpus) < gpus_per_worker:
            problems.append(f"worker {address} sees {len(gpus)} GPU(s) ({', '.join(gpus)}), an engine of tensor_parallel_size "
                            f"{gpus_per_worker} needs {gpus_per_worker}")
        elif not gpus and gpus_per_worker > 1:
            problems.append(f"worker {address} sees no GPU, an engine of tensor_parallel_size {gpus_per_worker} needs "
                            f"{gpus_per_worker} (a CPU engine runs with tensor_parallel_size 1)")
        for gpu in gpus:
            by_host.setdefault((view.get("host", "?"), gpu), []).append(address)
    shared = sorted({tuple(sorted(a)) for a in by_host.values() if len(a) > 1})
    for addresses in shared:
        gpus = sorted(g for (h, g), a in by_host.items() if tuple(sorted(a)) == addresses)
        problems.append(f"workers {', '.join(addresses)} on one host see the same GPU(s) {', '.join(gpus)}: two engines "
                        "would share them")
    if problems:
        raise ConfigError(f"the dask cluster's workers cannot each run one hint engine: {'; '.join(problems)}; {_WORKER_FIX}")
    return len(seen)


def engine_memory_limit(workers: int) -> int:
    """Bytes each of `workers` local engine workers may use: an equal share of the machine's memory.

    dask's default (``memory_limit="auto"``) is RAM x threads / cores, a few GiB for a one-thread
    worker on a many-core node, and at 80% of it the worker pauses: an engine worker would stop
    taking shards while its engine holds the memory, and wait forever. An engine worker runs one
    task at a time and owns its share of the node; the Nanny restarts it only past 95% of that.
    """
    from distributed import system  # optional: the dask extra

    return max(1, int(system.MEMORY_LIMIT // max(1, workers)))


# An engine worker neither pauses (it would never resume while its engine holds the memory) nor spills:
# the memory is the engine's, not dask's data.
ENGINE_WORKER_MEMORY = {"distributed.worker.memory.pause": False, "distributed.worker.memory.spill": False,
                        "distributed.worker.memory.target": False}


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, gpus_per_worker: int = 1,
                timeout: float = SCHEDULER_TIMEOUT, engines: bool = False) -> Iterator[Any]:
    """A dask Client for `scheduler`, or for a local cluster of `workers` engine workers.

    Local workers can each run one vLLM engine: they are not daemonic (dask's
    ``distributed.worker.daemon: False``; vLLM starts its EngineCore as a child
    process, which a daemonic process may not have), run one task at a time, each
    sees only its own devices (`mentor.pipeline.devices.engine_worker_env`:
    `gpus_per_worker` GPUs each, or its own cores on a CPU node), and each may use an
    equal share of the machine's memory without pausing (`engine_memory_limit`).
    Workers of an existing cluster (`scheduler`) are the user's to start that way
    (docs/gpus.md); the scheduler must answer, and have a worker, within `timeout` seconds, and
    with `engines` (the stage runs vLLM engines) each worker is checked before the first shard
    (`check_engine_workers`: one thread, not daemonic, GPUs of its own).
    """
    distributed = _distributed()
    if workers is not None and scheduler is not None:
        raise ConfigError("--workers starts a local cluster and --scheduler joins an existing one: give one of them "
                          "(the workers of an existing cluster are started there, with `dask worker`)")
    if scheduler is not None:
        client = connect_scheduler(scheduler, timeout)
        try:
            if engines:
                check_engine_workers(client, gpus_per_worker)
            yield client
        finally:
            client.close()
        return
    if not workers or workers < 1:
        raise ConfigError("--workers must be >= 1 (or pass --scheduler ADDRESS)")
    import dask  # optional: the dask extra

    envs = engine_worker_env(workers, gpus_per_worker)
    quiet = {"host": "127.0.0.1", "dashboard": False, "silence_logs": logging.WARNING}
    limit = engine_memory_limit(workers)
    specs = {f"engine-{i}": {"cls": distributed.Nanny,
                             "options": {"nthreads": 1, "env": env, "memory_limit": limit, **quiet}}
             for i, env in enumerate(envs)}
    scheduler_spec = {"cls": distributed.Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    # Each Nanny hands the config to its worker when it starts (or restarts) it: keep it for the cluster's life.
    with dask.config.set({"distributed.worker.daemon": False, **ENGINE_WORKER_MEMORY}), _quiet_dask_logs():
        with distributed.SpecCluster(workers=specs, scheduler=scheduler_spec, name="mentor") as cluster, \
                distributed.Client(cluster) as client:
            yield client


@contextmanager
def _quiet_dask_logs() -> Iterator[None]:
    """dask's INFO lines (scheduler and nanny start/stop) are not the user's business, as with LocalCluster."""
    logger = logging.getLogger("distributed")
    level = logger.level
    if not logging.getLogger("mentor").isEnabledFor(logging.INFO):
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def executor_for(client: Any = None, resources: dict[str, float] | None = None) -> Executor:
    """`DaskExecutor` on `client`, or a `LocalExecutor` when there is none."""
    return LocalExecutor() if client is None else DaskExecutor(client, resources=resources)


@contextmanager
def open_executor(workers: int | None = None, scheduler: str | None = None, gpus_per_worker: int = 1,
                  timeout: float = SCHEDULER_TIMEOUT, engines: bool = False) -> Iterator[Executor]:
    """The executor ``--workers`` / ``--scheduler`` ask for (neither: this process), open for the block.

    `engines`: the stage runs vLLM engines of `gpus_per_worker` devices each; their layout is checked before
    the first shard (`mentor.pipeline.devices.check_engine_devices` here, `check_engine_workers` on a cluster).
    """
    if workers is None and scheduler is None:
        if engines:
            check_engine_devices(gpus_per_worker)
        yield LocalExecutor()
        return
    with dask_client(workers=workers, scheduler=scheduler, gpus_per_worker=gpus_per_worker, timeout=timeout,
                     engines=engines) as client:
        yield DaskExecutor(client)


__all__ = ["DaskExecutor", "Executor", "LocalExecutor", "SCHEDULER_TIMEOUT", "check_engine_workers", "connect_scheduler", "dask_client",
           "engine_memory_limit", "executor_for", "open_executor", "scheduler_address"]
