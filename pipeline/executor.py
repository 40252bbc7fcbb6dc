"""Where a stage's shard tasks run: in this process, or on a dask.distributed cluster.

A stage maps a top-level (picklable) function over its shards with
``executor.map(fn, items, *args)`` (all results, in item order) or
``executor.imap(...)`` (results one at a time, in item order, so the caller can
write each as it comes and hold only a few). `fn(item, *args)` is the same call
either way; the stage does not know where it runs.

- `LocalExecutor` runs the tasks here, one after the other: polars and pyarrow
  already use every core within a task.
- `DaskExecutor` runs them as dask tasks (``--workers N`` starts a LocalCluster,
  ``--scheduler ADDRESS`` joins one); dask retries the tasks of a lost worker.
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


class LocalExecutor:
    """Each task in this process, in order."""

    def map(self, fn: Callable, items: Iterable, *args: Any) -> list:
        return [fn(item, *args) for item in items]

    def imap(self, fn: Callable, items: Iterable, *args: Any) -> Iterator:
        for item in items:
            yield fn(item, *args)

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
def dask_client(workers: int | None = None, scheduler: str | None = None, **cluster_kwargs: Any) -> Iterator[Any]:
    """A dask Client for `scheduler`, or for a LocalCluster of `workers` processes."""
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
    cluster_kwargs.setdefault("threads_per_worker", 1)
    cluster_kwargs.setdefault("processes", True)
    cluster_kwargs.setdefault("dashboard_address", None)
    with distributed.LocalCluster(n_workers=workers, **cluster_kwargs) as cluster, distributed.Client(cluster) as client:
        yield client


def executor_for(client: Any = None, resources: dict[str, float] | None = None) -> Executor:
    """`DaskExecutor` on `client`, or a `LocalExecutor` when there is none."""
    return LocalExecutor() if client is None else DaskExecutor(client, resources=resources)


@contextmanager
def open_executor(workers: int | None = None, scheduler: str | None = None) -> Iterator[Executor]:
    """The executor ``--workers`` / ``--scheduler`` ask for (neither: this process), open for the block."""
    if workers is None and scheduler is None:
        yield LocalExecutor()
        return
    with dask_client(workers=workers, scheduler=scheduler) as client:
        yield DaskExecutor(client)


__all__ = ["DaskExecutor", "Executor", "LocalExecutor", "dask_client", "executor_for", "open_executor"]
