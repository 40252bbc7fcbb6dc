"""The GPUs a training round needs, the GPUs that are there, and the check between them.

A trainer asks Ray (or torch.distributed) for GPUs in reservations: OpenRLHF
reserves placement groups of one-GPU bundles (actor, reference, vLLM engines,
or one shared group when they are colocated), verl reserves resource pools of
``n_gpus_per_node`` on each of ``nnodes`` nodes, TRL starts one process per GPU.
A reservation that the cluster cannot place makes Ray wait forever without a
message, so mentor refuses such a round before launching it.

- `GpuDemand`: what one round needs, as `GpuGroup` reservations with the roles
  that share each. `GpuDemand.of_roles` builds one for any trainer; OpenRLHF's
  comes from its own placement code (`mentor.training.openrlhf.placement`).
- `GpuSupply`: what is there: a Ray cluster's GPU resources (when the trainer
  will connect to an existing cluster), else this machine's devices
  (``MENTOR_FAKE_GPUS`` overrides the count, for tests and login nodes).
- `GpuDemand.check(supply)` raises `GpuShortage` with one message naming both
  numbers and the setting to change.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import dataclass, field

from mentor.pipeline.devices import FAKE_GPUS_ENV
from mentor.pipeline.devices import local_gpus as device_ids
from mentor.pipeline.errors import ConfigError

log = logging.getLogger(__name__)

ENV_FAKE_GPUS = "MENTOR_FAKE_GPUS"  # = mentor.pipeline.devices.FAKE_GPUS_ENV


class GpuShortage(ConfigError):
    """The round asks for more GPUs than the cluster or machine has (exit 2, before launch)."""


@dataclass(frozen=True)
class GpuGroup:
    """One reservation: `gpus` GPUs shared by `roles`.

    `per_node` set: the reservation needs ``gpus / per_node`` nodes with `per_node`
    GPUs free on each (verl's resource pools); unset: one-GPU bundles Ray may
    spread over any nodes (OpenRLHF's placement groups, strategy PACK).
    """

    gpus: float
    roles: tuple[str, ...]
    detail: str = ""
    per_node: int | None = None

    def text(self) -> str:
        n = _num(self.gpus)
        label = self.roles[0] if len(self.roles) == 1 else f"shared by {', '.join(self.roles)}"
        return f"{n} {label}" + (f": {self.detail}" if self.detail else "")


@dataclass
class GpuSupply:
    """GPUs that are there: `total`, `free` (= total unless a cluster reports fewer free), per node, and where."""

    total: float
    where: str  # "the Ray cluster at 10.0.0.1:6379", "this machine (nvidia-smi)", ...
    per_node: list[float] = field(default_factory=list)
    free: float | None = None

    @property
    def usable(self) -> float:
        return self.total if self.free is None else self.free

    def text(self) -> str:
        s = f"{self.where} has {_num(self.total)}"
        if self.free is not None and self.free < self.total:
            s += f" ({_num(self.free)} free)"
        if len(self.per_node) > 1:
            s += f" on {len(self.per_node)} nodes"
        return s


@dataclass
class GpuDemand:
    """The GPUs one round needs.

    `fixes`: settings that would make it fit, each with the GPUs it would then
    need, e.g. ``("extra_args 'train.colocate_all': true", 8)``; the check names
    those that fit the supply.
    """

    trainer: str
    groups: list[GpuGroup]
    nodes: int = 1
    fixes: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of_roles(
        cls,
        trainer: str,
        roles: dict[str, float],
        nodes: int = 1,
        per_node: int | None = None,
        shared: bool = False,
        detail: str = "",
        fixes: list[tuple[str, float]] | None = None,
    ) -> "GpuDemand":
        """A demand from per-role GPU counts: one reservation per role, or (`shared`) one shared
        by every role, sized by the largest count (roles colocated on the same GPUs)."""
        live = {r: g for r, g in roles.items() if g > 0}
        if shared and live:
            groups = [GpuGroup(max(live.values()), tuple(live), detail, per_node)]
        else:
            groups = [GpuGroup(g, (r,), detail if len(live) == 1 else "", per_node) for r, g in live.items()]
        return cls(trainer, groups, nodes, list(fixes or []))

    @property
    def total(self) -> float:
        return sum(g.gpus for g in self.groups)

    @property
    def per_role(self) -> dict[str, float]:
        """GPUs per role; a shared reservation counts fully for each of its roles."""
        out: dict[str, float] = {}
        for g in self.groups:
            for r in g.roles:
                out[r] = out.get(r, 0) + g.gpus
        return out

    def describe(self) -> str:
        """``24 GPUs (8 actor + 8 reference + 8 vLLM: 8 engines x TP 1)``."""
        if not self.groups:
            return "no GPUs"
        return f"{_num(self.total)} GPU{'s' if self.total != 1 else ''} ({' + '.join(g.text() for g in self.groups)})"

    def shortage(self, supply: GpuSupply) -> str | None:
        """Why the round cannot be placed on `supply` (None when it can)."""
        if self.total > supply.usable + 1e-9:
            return f"this round needs {self.describe()}, {supply.text()}"
        if supply.per_node:
            for g in self.groups:
                if g.per_node:
                    want = math.ceil(g.gpus / g.per_node)
                    have = sum(1 for n in supply.per_node if n >= g.per_node)
                    if want > have:
                        return (f"this round needs {want} node{'s' if want > 1 else ''} with {g.per_node} GPUs each "
                                f"({g.text()}), {supply.text()} ({have} with {g.per_node} or more)")
        return None

    def check(self, supply: GpuSupply) -> None:
        """Raise `GpuShortage` when the round cannot be placed on `supply`."""
        why = self.shortage(supply)
        if why is None:
            return
        fits = [f"set {name} (then it needs {_num(gpus)})" for name, gpus in self.fixes if gpus <= supply.usable + 1e-9]
        biggest = max(supply.per_node or [supply.total] or [0])
        if biggest >= 1:
            nodes = math.ceil(self.total / biggest)
            fits.append(f"run it on a Ray cluster of {nodes} nodes with {_num(biggest)} GPUs each (`ray start` on each, RAY_ADDRESS set)")
        else:
            fits.append("run it where GPUs are (a GPU node, or a Ray cluster: `ray start` on each node, RAY_ADDRESS set)")
        raise GpuShortage(f"{why}: {' or '.join(fits)}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# --------------------------------------------------------------------------- this machine


def local_gpus() -> GpuSupply:
    """This machine's GPUs, as `mentor.pipeline.devices.local_gpus` finds them: ``MENTOR_FAKE_GPUS``
    (a count), else ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi`` (what a fresh local Ray cluster sees)."""
    n = len(device_ids())
    if os.environ.get(FAKE_GPUS_ENV) is not None:
        where = f"this machine ({FAKE_GPUS_ENV}={os.environ[FAKE_GPUS_ENV]})"
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        where = f"this machine (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
    else:
        where = "this machine (nvidia-smi)" if shutil.which("nvidia-smi") else "this machine (no nvidia-smi: no GPUs)"
    return GpuSupply(n, where, [n])


def cluster_supply(cluster: dict) -> GpuSupply:
    """The GPUs of a Ray cluster as `mentor.training.ray_preflight` reports it."""
    nodes = [float(n.get("gpus") or 0) for n in cluster.get("nodes", [])]
    total = float(cluster.get("gpus_total", sum(nodes)))
    free = cluster.get("gpus_free")
    return GpuSupply(total, f"the Ray cluster at {cluster.get('address')}", nodes, None if free is None else float(free))


__all__ = [
    "ENV_FAKE_GPUS",
    "GpuDemand",
    "GpuGroup",
    "GpuShortage",
    "GpuSupply",
    "cluster_supply",
    "local_gpus",
]
