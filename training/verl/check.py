"""verl's own verdict on a round before launch: its config composed and validated (`check_with_verl`), the
runtime env its ``run_ppo`` hands to ``ray.init`` and whether Ray would merge it with the job's
(`check_ray_init`), and the GPUs and nodes the round needs (`preflight`). verl, OmegaConf and Ray are
imported only here, and only when installed."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from mentor.pipeline.errors import ConfigError
from mentor.training.gpus import cluster_supply, local_gpus
from mentor.training.ray_preflight import check_reward_reach, probe_cluster
from mentor.training.rollout_log import RAY_JOB_CONFIG_ENV, check_rollout_reach
from mentor.training.verl.hydra import INSTALL, compose, gpu_demand, one_line

if TYPE_CHECKING:
    from mentor.training.verl.config import VerlTrainConfig


@contextlib.contextmanager
def environ(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ray_init_runtime_env(composed, env: dict[str, str]) -> dict[str, Any]:
    """The runtime env verl's ``run_ppo`` hands to ``ray.init`` for `composed` in a driver whose environment is
    `env`: verl's ``get_ppo_ray_runtime_env`` (which drops the variables the driver already has), then
    ``ray_kwargs.ray_init.runtime_env`` over it, as ``run_ppo`` merges them."""
    from omegaconf import OmegaConf  # optional: verl's config library
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env  # verl: optional and slow to import

    with environ(env):
        default = get_ppo_ray_runtime_env(composed)
    if OmegaConf.select(composed, "transfer_queue.enable"):
        default.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    given = OmegaConf.select(composed, "ray_kwargs.ray_init.runtime_env") or {}
    return OmegaConf.to_container(OmegaConf.merge(default, given), resolve=True)


def check_ray_init(composed, env: dict[str, str]) -> str | None:
    """Refuse a round whose ``ray.init`` Ray would reject: the job's runtime env (``RAY_JOB_CONFIG_JSON_ENV_VAR``)
    and verl's runtime env merged by Ray's own ``_merge_runtime_env``. Returns a note when it cannot check."""
    if not env.get(RAY_JOB_CONFIG_ENV):
        return None
    try:
        from ray.runtime_env.runtime_env import _merge_runtime_env  # Ray: optional and slow to import
    except ImportError as exc:
        return f"the runtime env merge of ray.init was not checked ({exc})"
    try:
        driver = ray_init_runtime_env(composed, env)
    except ImportError as exc:
        return f"the runtime env merge of ray.init was not checked ({exc})"
    job = (json.loads(env[RAY_JOB_CONFIG_ENV]).get("runtime_env") or {})
    if _merge_runtime_env(job, driver, override=env.get("RAY_OVERRIDE_JOB_RUNTIME_ENV") == "1") is None:
        fields = sorted((set(job) & set(driver)) - {"env_vars"})
        keys = sorted(set(job.get("env_vars") or {}) & set(driver.get("env_vars") or {}))
        raise ConfigError(
            f"ray.init in verl's run_ppo would refuse this round: the job's runtime env ({RAY_JOB_CONFIG_ENV}) and "
            f"verl's runtime env (ray_kwargs.ray_init.runtime_env and verl's defaults) both set "
            f"{', '.join([*fields, *keys])}; set each in one of them only, or RAY_OVERRIDE_JOB_RUNTIME_ENV=1 "
            "to let verl's win")
    return None


def check_with_verl(overrides: list[str], expected: dict[str, Any]) -> tuple[Any, list[str]]:
    """Compose `overrides` with verl's packaged config, read the round's `expected` values back, run verl's
    ``validate_config``; returns (the composed config, the notes verl printed). `ConfigError` on a rejection."""
    from omegaconf import OmegaConf  # optional: verl's config library

    composed = compose(overrides)
    for key, want in expected.items():
        got = OmegaConf.select(composed, key)
        got = OmegaConf.to_container(got, resolve=True) if OmegaConf.is_config(got) else got
        if isinstance(want, dict):
            got = {k: v for k, v in (got or {}).items() if k in want}
        if got != want:
            raise ConfigError(f"verl's config reads {key} as {got!r}, not {want!r}; rename the path or report this")
    out, err = io.StringIO(), io.StringIO()
    logging.disable(logging.WARNING)  # verl's import warns that this machine has no GPU: not the round's business
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # verl: optional and slow to import; imported here so that its warnings and prints are caught
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config  # likewise
            from verl.utils.device import auto_set_device  # likewise

            auto_set_device(composed)
            validate_config(config=composed, use_reference_policy=need_reference_policy(composed),
                            use_critic=need_critic(composed))
    except ImportError as exc:
        notes = [f"verl's validate_config did not run: {exc} (the Hydra compose did); {INSTALL}"]
        return composed, notes
    except Exception as exc:  # AssertionError, ValueError, Hydra's InstantiationException around them
        raise ConfigError(f"verl's validate_config rejects the round: {one_line(exc)}") from None
    finally:
        logging.disable(logging.NOTSET)
    notes = [ln.strip() for ln in (out.getvalue() + err.getvalue()).splitlines() if ln.strip()]
    notes += sorted({str(w.message) for w in caught})
    return composed, notes


def preflight(cfg: VerlTrainConfig, composed, extra_env: dict[str, str], reward: str) -> dict[str, Any]:
    """Refuse a round the GPUs cannot place, or whose rollout log dir or reward file (`reward`) the Ray workers
    cannot reach."""
    demand = gpu_demand(composed) if composed is not None else None
    env = dict(os.environ) | extra_env
    try:  # join as verl's run_ppo does: its runtime env, which Ray merges with the job's
        runtime_env = ray_init_runtime_env(composed, env) if composed is not None else None
    except ImportError:
        runtime_env = None
    cluster = probe_cluster(env, init="plain", python=cfg.python, runtime_env=runtime_env,
                            reward=(reward, cfg.reward_function))
    supply = cluster_supply(cluster) if cluster else local_gpus()
    if demand is not None:
        demand.check(supply)
    hosts = check_rollout_reach(cluster, cfg.rollout_dir)
    check_reward_reach(cluster, reward)  # verl's reward-loop workers load it by path on any node
    return {"gpus_needed": demand.total if demand else None, "gpus_detail": demand.describe() if demand else None,
            "gpus_there": supply.total, "gpus_where": supply.where, "ray_cluster": cluster.get("address") if cluster else None,
            "rollout_dir_checked_on": hosts}


__all__ = ["check_ray_init", "check_with_verl", "environ", "preflight", "ray_init_runtime_env"]
