"""verl's configuration as Hydra sees it: the override syntax, verl's packaged config composed with a
round's overrides (as ``main_ppo``'s ``@hydra.main`` does), and the GPUs its resource pools reserve.
Nothing here needs verl imported (only its config folder) or a GPU."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.training.gpus import GpuDemand, GpuGroup

INSTALL = "pip install verl==0.9.1 (its GPU stack as verl's docs say); for the config check alone: pip install --no-deps verl==0.9.1 'hydra-core>=1.3,<1.4' tensordict codetiming peft ray"
_BARE = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_.:/+\-]*")
_TYPED = {"true", "false", "null", "nan", "inf"}  # bare words Hydra reads as another type


def hydra_quote(text: str) -> str:
    """`text` as a Hydra quoted string that Hydra reads back unchanged (no interpolation)."""
    text = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("'", "\\'").replace("${", "\\${") + "'"


def hydra_value(value: Any, quote: bool = False) -> str:
    """A YAML value as a Hydra override value: strings that look plain stay bare (Hydra types them, so
    "1e-6" is a float), others are quoted; lists and mappings in Hydra's syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v, quote) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v, quote)}" for k, v in value.items()) + "}"
    text = str(value)
    if quote:  # a path or name that must stay a string: bare only where Hydra cannot read anything else
        plain = _BARE.fullmatch(text) and ("/" in text or (text.isidentifier() and text.lower() not in _TYPED))
        return text if plain else hydra_quote(text)
    return text if _BARE.fullmatch(text) else hydra_quote(text)


def hydra_unquote(text: str) -> str:
    """The value `hydra_quote` quoted, as it was."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        body = text[1:-1].replace("\\${", "${").replace("\\'", "'")
        return re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1)[: len(m.group(1)) // 2], body)
    return text


def verl_config_dir() -> Path:
    """verl's packaged Hydra config folder (found without importing verl, which needs ray and tensordict)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"verl is not installed; {INSTALL}")
    d = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
    if not (d / "ppo_trainer.yaml").is_file():
        raise ConfigError(f"{d}: no ppo_trainer.yaml; is this verl 0.9.x?")
    return d


def one_line(exc: BaseException) -> str:
    """An exception (and its cause) as one line: Hydra's and verl's messages span several."""
    text = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def compose(overrides: list[str]):
    """verl's ``ppo_trainer`` config composed by Hydra with `overrides`, as ``main_ppo``'s ``@hydra.main`` does."""
    try:
        from hydra import compose as hydra_compose  # optional: verl's config library
        from hydra import initialize_config_dir  # likewise
        from hydra.core.global_hydra import GlobalHydra  # likewise
    except ImportError as exc:
        raise ConfigError(f"the verl config check needs hydra-core ({exc}); {INSTALL}") from None
    config_dir = verl_config_dir()
    if GlobalHydra.instance().is_initialized():  # inside another Hydra app (tests): compose on a clean slate
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=overrides)
    except Exception as exc:  # Hydra's override parser and OmegaConf's struct checks raise many kinds
        raise ConfigError(f"verl's config rejects the round's overrides: {one_line(exc)}") from None


@functools.lru_cache(maxsize=2)
def _packaged(config_dir: str):
    return compose([])


def packaged_config():
    """verl's packaged ``ppo_trainer`` config with no overrides (composed once): the schema of the overrides."""
    return _packaged(str(verl_config_dir()))


def typed_overrides(overrides: list[str]) -> dict[str, Any]:
    """Each override (``key=value``, ``+key=``, ``++key=``) as Hydra types its value: key -> value (deletions left out)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # optional: verl's config library

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # Hydra's grammar errors
        raise ConfigError(f"verl's config rejects the round's overrides: {one_line(exc)}") from None
    return {o.key_or_group: o.value() for o in parsed if not o.is_delete()}


def gpu_demand(composed) -> Any:
    """The GPUs verl's resource pools reserve for the composed config (`mentor.training.gpus.GpuDemand`)."""
    t = composed.trainer
    per_node, nodes = int(t.n_gpus_per_node), int(t.nnodes)
    total = per_node * nodes
    rm = composed.reward.reward_model
    rm_pool = int(rm.n_gpus_per_node) * int(rm.nnodes) if rm.enable and rm.enable_resource_pool else 0
    # One resource pool, actor, rollout and reference colocated on it (verl's hybrid engine).
    demand = GpuDemand.of_roles("verl", {"actor": total, "rollout": total, "reference": total}, nodes=nodes,
                                per_node=per_node, shared=True, detail=f"nnodes {nodes} x n_gpus_per_node {per_node}",
                                fixes=[("nnodes 1", per_node + rm_pool)] if nodes > 1 else [])
    if rm_pool:  # a pool of its own for the reward model
        demand.groups.append(GpuGroup(int(rm.n_gpus_per_node) * int(rm.nnodes), ("reward model",),
                                      f"reward.reward_model nnodes {rm.nnodes} x n_gpus_per_node {rm.n_gpus_per_node}",
                                      int(rm.n_gpus_per_node)))
        demand.nodes += int(rm.nnodes)
    return demand
