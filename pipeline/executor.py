"""Where a stage's shard tasks run: in this process, or on a dask.distributed cluster.

A stage maps a top-level (picklable) function over its shards with
``executor.map(fn, items, *args)`` (all results, in item order) or
``executor.imap(...)`` (results one at a time, in item order, so the caller can
write each as it comes and hold only a few). `fn(item, *args)` is the same call
either way; the stage does not know where it runs.

- `LocalExecutor` runs the tasks here, one after the other: polars and pyarrow
  already use every core within a task.
- `DaskExecutor` runs them as dask tasks (``--workers N`` starts a local cluster
  of N engine workers, ``--scheduler ADDRESS`` joins one); dask retries the
  tasks of a lost worker. A worker keeps its engine across the shards it runs;
  `close_engines` stops them all when the stage ends.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from mentor.pipeline.errors import ConfigError

log = logging.getLogger(__name__)


class Executor(Protocol):
    def map(self, fn: Callable, items: Iterable, *args: Any) -> list: ...

    def imap(self, fn: Callable, items: Iterable, *args: Any) -> Iterator: ...

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
        from mentor.pipeline.llm import close_backends

        close_backends()

    def __repr__(self) -> str:
        return "LocalExecutor()"


class DaskExecutor:
    """Each task on a dask.distributed cluster (results in item order).

    `resources` (e.g. ``{"GPU": 1}``) makes each task need that much of a worker
    resource: on a GPU cluster started with ``dask worker --resources GPU=1`` one
    hint shard runs per GPU and each worker owns one engine. `imap` keeps at most
    `window` tasks submitted ahead of the one being consumed.
    """

    def __init__(self, client: Any, retries: int = 2, resources: dict[str, float] | None = None, window: int = 8) -> None:
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
        from mentor.pipeline.llm import close_backends

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
        import distributed
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("dask.distributed is not installed; pip install 'mentor[dask]'") from exc
    return distributed


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, gpus_per_worker: int = 1) -> Iterator[Any]:
    """A dask Client for `scheduler`, or for a local cluster of `workers` engine workers.

    Local workers can each run one vLLM engine: they are not daemonic (dask's
    ``distributed.worker.daemon: False``; vLLM starts its EngineCore as a child
    process, which a daemonic process may not have), run one task at a time, and
    each sees only its own devices (`mentor.pipeline.devices.engine_worker_env`:
    `gpus_per_worker` GPUs each, or its own cores on a CPU node). Workers of an
    existing cluster (`scheduler`) are the user's to start that way (docs/gpus.md).
    """
    distributed = _distributed()
    if scheduler:
        client = distributed.Client(scheduler)
        try:
            yield client
        finally:
            client.close()
        return
    if not workers or workers < 1:
        raise ConfigError("--workers must be >= 1 (or pass --scheduler ADDRESS)")
    import dask

    from mentor.pipeline.devices import engine_worker_env

    envs = engine_worker_env(workers, gpus_per_worker)
    quiet = {"host": "127.0.0.1", "dashboard": False, "silence_logs": logging.WARNING}
    specs = {f"engine-{i}": {"cls": distributed.Nanny, "options": {"nthreads": 1, "env": env, **quiet}}
             for i, env in enumerate(envs)}
    scheduler_spec = {"cls": distributed.Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    # The daemon setting is read by each Nanny when it starts (or restarts) its worker: keep it for the cluster's life.
    with dask.config.set({"distributed.worker.daemon": False}), _quiet_dask_logs():
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
def open_executor(workers: int | None = None, scheduler: str | None = None, gpus_per_worker: int = 1) -> Iterator[Executor]:
    """The executor ``--workers`` / ``--scheduler`` ask for (neither: this process), open for the block."""
    if workers is None and scheduler is None:
        yield LocalExecutor()
        return
    with dask_client(workers=workers, scheduler=scheduler, gpus_per_worker=gpus_per_worker) as client:
        yield DaskExecutor(client)


__all__ = ["DaskExecutor", "Executor", "LocalExecutor", "dask_client", "executor_for", "open_executor"]
