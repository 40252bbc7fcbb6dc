"""dask.distributed scale-out: a `map_fn` that runs stage functions on a cluster.

Stages are written as map/reduce over shards with a pluggable
``map_fn(fn, items, *args) -> list`` (see `stages.mine`). Here that map runs
on dask.distributed: ``--workers N`` starts a LocalCluster, ``--scheduler
ADDRESS`` joins an existing one. dask's own scheduler retries the tasks of a
lost worker; there is no home-made scheduler here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mentor.pipeline.errors import ConfigError

log = logging.getLogger(__name__)


def _distributed():
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("dask.distributed is not installed; pip install 'mentor[dask]'") from exc
    return distributed


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, **cluster_kwargs) -> Iterator[object]:
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


def dask_map(client, retries: int = 2, resources: dict[str, float] | None = None) -> Callable[..., list]:
    """A `map_fn` running `fn(item, *args)` per item as dask tasks, results in item order.

    `resources` (e.g. ``{"GPU": 1}``) makes each task need that much of a worker
    resource, so on a GPU cluster started with ``dask worker --resources GPU=1``
    one hint shard runs per GPU and each worker owns one engine.
    """

    def map_fn(fn: Callable, items: list, *args) -> list:
        if not items:
            return []
        scattered = [client.scatter(a, broadcast=True) if _large(a) else a for a in args]
        futures = client.map(fn, items, *[[a] * len(items) for a in scattered], retries=retries, pure=False,
                             resources=resources)
        return client.gather(futures)

    return map_fn


def _large(obj) -> bool:
    try:
        return len(obj) > 10_000  # e.g. a Series of collapsed ids
    except TypeError:
        return False
