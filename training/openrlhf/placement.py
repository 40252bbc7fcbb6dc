"""The GPUs an OpenRLHF 0.11 round reserves, read from OpenRLHF's own placement code.

`openrlhf_demand(args)` runs, on the arguments OpenRLHF's launch code parsed
(`mentor.training.openrlhf.check.check_with_openrlhf`), the installed source of

- ``openrlhf.cli.train_ppo_ray.train`` up to the trainer's start (the colocation
  branches, its placement groups, which models exist: no reference model when
  ``algo.kl.init_coef`` is 0, a critic only for ``gae``, no reward model with
  ``reward.remote_url``),
- ``openrlhf.trainer.ray.vllm_engine.create_vllm_engines`` (the engines' own
  placement group unless they share the colocated one),
- ``openrlhf.trainer.ray.launcher.RayActorGroup`` (a group's placement group when
  it has more than one GPU and none is given),
- ``openrlhf.trainer.ray.utils.get_bundle_indices``,

against a recorder that stands in for Ray: every ``placement_group(bundles)``
and every actor's ``.options(num_gpus=..., scheduling_strategy=...)`` is kept,
nothing starts. The round's GPUs are the bundles of its placement groups plus
the actors placed outside any group. No rule is copied here: a new OpenRLHF
release that places differently changes the count with it.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.training.gpus import GpuDemand, GpuGroup
from mentor.training.openrlhf.check import check_with_openrlhf

# OpenRLHF's actor classes -> the role names mentor reports.
ROLES = {
    "PolicyModelActor": "actor",
    "ReferenceModelActor": "reference",
    "CriticModelActor": "critic",
    "RewardModelActor": "reward model",
    "RolloutRayActor": "vLLM",
}
_ROLE_ORDER = {r: i for i, r in enumerate(ROLES.values())}
_STOP_AT = "openrlhf.trainer.ppo_trainer"  # train() imports the trainer once every model is placed


class _Placed(Exception):
    """train() reached the trainer import: every reservation is made."""


class _PG:
    def __init__(self, bundles: list[dict], strategy: str = "PACK") -> None:
        self.bundles = [dict(b) for b in bundles]
        self.strategy = strategy
        self.roles: list[str] = []

    def ready(self) -> "_PG":
        return self


class _Handle:
    """A started actor: every method's ``.remote()`` answers something harmless."""

    def __getattr__(self, name: str):
        value = ("127.0.0.1", 29500) if name == "get_master_addr_port" else None
        return SimpleNamespace(remote=lambda *a, **k: value)


class _Recorder:
    def __init__(self) -> None:
        self.groups: list[_PG] = []
        self.lone: list[tuple[str, float]] = []  # actors outside any placement group

    def placement_group(self, bundles, strategy="PACK", *a, **k) -> _PG:
        pg = _PG(bundles, strategy)
        self.groups.append(pg)
        return pg

    def actor_class(self, name: str):
        rec = self

        class _Options:
            def __init__(self, num_gpus=0, scheduling_strategy=None, **kw) -> None:
                self.num_gpus = float(num_gpus or 0)
                self.pg = getattr(scheduling_strategy, "placement_group", None)

            def remote(self, *a, **k) -> _Handle:
                role = ROLES.get(name, name)
                if self.pg is not None:
                    if role not in self.pg.roles:
                        self.pg.roles.append(role)
                elif self.num_gpus:
                    rec.lone.append((role, self.num_gpus))
                return _Handle()

        return SimpleNamespace(options=lambda **kw: _Options(**kw), remote=lambda *a, **k: _Options(num_gpus=1).remote())

    def ray(self) -> SimpleNamespace:
        def table(pg):
            return {"bundles_to_node_id": {i: "node" for i in range(len(pg.bundles))}}

        return SimpleNamespace(
            is_initialized=lambda: True,
            init=lambda *a, **k: None,
            get=lambda ref, *a, **k: ref,
            util=SimpleNamespace(placement_group_table=table),
        )


def _source(module: str) -> tuple[str, ast.Module]:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ConfigError(f"{module} is not installed; pip install --no-deps openrlhf==0.11.2")
    return spec.origin, ast.parse(Path(spec.origin).read_text(), filename=spec.origin)


def _definition(module: str, name: str) -> tuple[str, ast.stmt]:
    origin, tree = _source(module)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            if isinstance(node, ast.ClassDef):
                node.decorator_list = []  # @ray.remote: the recorder stands in for it
            return origin, node
    raise ConfigError(f"{origin}: no {name}; is this OpenRLHF 0.11.x?")


def openrlhf_demand(args: Any) -> GpuDemand:
    """The GPUs OpenRLHF's `train(args)` reserves, per reservation and role (see the module's docstring)."""
    rec = _Recorder()
    fake_ray = rec.ray()

    def importer(name, globals=None, locals=None, fromlist=(), level=0):
        if name.startswith(_STOP_AT):
            raise _Placed
        if name == "ray" or name.startswith("ray."):
            return fake_ray
        if name == "transformers":  # a VLM's processor is read for its pad tokens, not for placement
            return SimpleNamespace(AutoProcessor=SimpleNamespace(from_pretrained=lambda *a, **k: SimpleNamespace()))
        return builtins.__import__(name, globals, locals, fromlist, level)

    ns: dict[str, Any] = {
        "__builtins__": dict(vars(builtins), __import__=importer),
        "__name__": "openrlhf_placement",
        "ray": fake_ray,
        "placement_group": rec.placement_group,
        "PlacementGroupSchedulingStrategy": lambda placement_group=None, **kw: SimpleNamespace(placement_group=placement_group),
        "PlacementGroup": _PG,
        "get_strategy": lambda a: SimpleNamespace(print=lambda *x, **k: None, args=a),
        "os": __import__("os"),
        "deepcopy": __import__("copy").deepcopy,
        "version": __import__("packaging.version", fromlist=["version"]),
        "vllm": SimpleNamespace(__version__="999"),  # only asserted on (a minimum version), never used to place
        "BaseModelActor": object,
        "batch_vllm_engine_call": lambda *a, **k: None,  # puts engines to sleep: nothing to place
        **{n: getattr(typing, n) for n in ("Any", "Dict", "List", "Optional", "Type")},
        **{cls: rec.actor_class(cls) for cls in ROLES},
    }
    defs = [
        ("openrlhf.trainer.ray.utils", "get_bundle_indices"),
        ("openrlhf.trainer.ray.launcher", "RayActorGroup"),
        ("openrlhf.trainer.ray.vllm_engine", "create_vllm_engines"),
        ("openrlhf.cli.train_ppo_ray", "train"),
    ]
    for module, name in defs:
        origin, node = _definition(module, name)
        exec(compile(ast.Module(body=[node], type_ignores=[]), origin, "exec"), ns)  # noqa: S102 - OpenRLHF's own code
    try:
        ns["train"](args)
    except _Placed:
        pass
    except AssertionError as exc:
        raise ConfigError(f"OpenRLHF's train_ppo_ray would stop at placement: {exc or 'an assertion failed'}") from None
    else:
        raise ConfigError("OpenRLHF's train() did not reach the trainer in mentor's placement check; is this OpenRLHF 0.11.x?")
    return _demand(rec, args)


def _demand(rec: _Recorder, args: Any) -> GpuDemand:
    engines = getattr(args.vllm, "num_engines", None) or 0
    tp = getattr(args.vllm, "tensor_parallel_size", 1)
    vllm_detail = f"{engines} engine{'s' if engines != 1 else ''} x TP {tp}"
    groups: list[GpuGroup] = []
    for pg in rec.groups:
        gpus = sum(float(b.get("GPU", 0)) for b in pg.bundles)
        if not gpus:
            continue
        roles = tuple(sorted(pg.roles, key=_ROLE_ORDER.get)) or ("reserved",)
        detail = vllm_detail if "vLLM" in roles and len(roles) == 1 else ""
        if len(roles) > 1:
            detail = "colocated" + (f", vLLM {vllm_detail}" if "vLLM" in roles else "")
        groups.append(GpuGroup(gpus, roles, detail))
    lone: dict[str, float] = {}
    for role, gpus in rec.lone:
        lone[role] = lone.get(role, 0) + gpus
    groups += [GpuGroup(g, (r,), vllm_detail if r == "vLLM" else "") for r, g in lone.items()]
    groups.sort(key=lambda g: min(_ROLE_ORDER.get(r, 99) for r in g.roles))
    return GpuDemand("openrlhf", groups, nodes=max(args.actor.num_nodes, args.ref.num_nodes))


# Colocation flags the shortage message offers, tried through OpenRLHF's own parser and placement code.
_FIXES = (
    ("train.colocate_all", "extra_args 'train.colocate_all': true"),
    ("train.colocate_actor_ref", "extra_args 'train.colocate_actor_ref': true"),
)


def round_demand(cmd: list[str], args: Any = None) -> GpuDemand:
    """The GPUs of the round `cmd` launches, with the colocation settings that would shrink it.

    `args`: what `check_with_openrlhf(cmd)` parsed (parsed here when not given).
    Each fix is the same command with one more colocation flag, parsed and placed
    by OpenRLHF's code; one OpenRLHF refuses (e.g. colocate_all needs actor GPUs =
    engines x TP) is not offered.
    """
    if args is None:
        args, _ = check_with_openrlhf(cmd)
    demand = openrlhf_demand(args)
    for flag, name in _FIXES:
        group, key = flag.split(".")
        if getattr(getattr(args, group), key, False) or args.train.colocate_all:
            continue
        try:
            alt = openrlhf_demand(check_with_openrlhf([*cmd, f"--{flag}"])[0])
        except ConfigError:
            continue
        if alt.total < demand.total:
            demand.fixes.append((name, alt.total))
    return demand


__all__ = ["ROLES", "openrlhf_demand", "round_demand"]
