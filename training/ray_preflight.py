"""Before a round: which Ray cluster the trainer will join, its GPUs, and a probe on every node.

`probe_cluster(env)` runs ``python -m mentor.training.ray_preflight``
in the trainer's environment (the same variables, RAY_ADDRESS and the
``RAY_JOB_CONFIG_JSON_ENV_VAR`` job config included). That process decides as
``ray.init()`` does (RAY_ADDRESS, else the last cluster `ray start` made on this
machine, else none). With no cluster it answers at once: the trainer will
start a fresh local one (`probe_cluster` returns None). Otherwise it joins the
cluster the way the trainer will (the ``ray.init`` statement of the trainer's
own driver where it declares one: OpenRLHF's ``train()``), reads the GPU resources, and runs one task pinned
to each alive node that writes a probe file into the ``MENTOR_ROLLOUT_DIR`` its
worker sees, checks that mentor's reward code imports there and (`reward`) loads
the reward file by its path as the trainer's actors will on that node (OpenRLHF's
``SingleTurnAgentExecutor``, verl's ``get_custom_reward_fn``). It prints one
JSON line: address, GPUs (total, free, per node), and each node's probe.

Run it with the round's ``python`` (the trainer's interpreter): Ray refuses a driver
whose Ray or Python version differs from the cluster's (``ray._private.utils.check_version_info``,
down to the Python patch level unless ``RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor``),
and the probe is refused the same way, with both versions named, before the trainer starts.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import socket
import sys
import uuid
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError
from mentor.training.reward_check import run_trainer_python
from mentor.training.rollout_log import ENV_DIR, PROBE_PREFIX

DEFAULT_TIMEOUT_S = 180.0


def probe_cluster(env: dict[str, str], init: str = "plain", python: str | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S, runtime_env: dict | None = None,
                  reward: tuple[str, str] | None = None) -> dict | None:
    """The Ray cluster the trainer launched with `env` will join, probed; None when it starts a fresh local one.

    `python`: the trainer's interpreter (the round's ``python``; default: this one), which joins as the trainer
    will: a Ray or Python version the cluster refuses is a ConfigError naming both versions.
    `init`: how to join: ``plain`` (``ray.init(runtime_env=runtime_env)``: the runtime env the trainer's own
    ray.init passes, e.g. verl's) or ``module:function``, the trainer's driver whose own ``ray.init`` statement
    runs (`run_ray_init_of`; OpenRLHF's launcher declares ``RAY_INIT``), where that module is installed.
    `reward`: ``(file, function)`` loaded by path on every node (each node's ``probe`` says ``reward_error``
    when it fails; `check_reward_reach` refuses it). A ConfigError names the address when joining or probing fails.
    """
    address = env.get("RAY_ADDRESS", "")
    if address == "local":
        return None
    python = python or sys.executable
    if python == sys.executable and find_spec("ray") is None:
        if address:
            raise ConfigError(
                f"RAY_ADDRESS={address} names a Ray cluster, but ray is not installed in mentor's environment, so the "
                "round's GPUs and rollout log dir cannot be checked: pip install ray, or set preflight: false"
            )
        return None  # no ray here: the trainer's ray.init() can only start a local cluster from this environment
    token = uuid.uuid4().hex[:12]
    cmd = [python, "-m", "mentor.training.ray_preflight", "--init", init, "--token", token, "--timeout", str(timeout_s / 2),
           "--python", python]
    if runtime_env is not None:
        cmd += ["--runtime-env", json.dumps(runtime_env)]
    if reward is not None:
        cmd += ["--reward", str(reward[0]), str(reward[1])]
    proc = run_trainer_python(cmd, env, timeout_s, " to check the Ray cluster",
                              f"the Ray cluster check did not finish in {timeout_s:.0f}s (RAY_ADDRESS={address or 'unset'}); "
                              "is the cluster up (`ray status`)?")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "No module named 'mentor" in tail:
            raise ConfigError(f"the trainer's Python ({python}) cannot import mentor, so it cannot check the Ray cluster "
                              f"the trainer would join ({tail}); install it there: pip install 'mentor[reward]'")
        raise ConfigError(f"cannot join the Ray cluster the trainer would use (RAY_ADDRESS={address or 'unset'}): {tail}")
    report = json.loads(lines[-1])
    if report.get("error"):
        raise ConfigError(f"the Ray cluster check failed (RAY_ADDRESS={address or 'unset'}): {report['error']}")
    return report.get("cluster")


def check_reward_reach(cluster: dict | None, reward: str | os.PathLike) -> list[str]:
    """Refuse unless every node of `cluster` loaded the reward file (`probe_cluster(..., reward=...)`).

    A fresh local cluster (None) has only this machine, where the launcher's reward check already ran.
    Returns the hosts checked.
    """
    if not cluster:
        return []
    problems, hosts = [], []
    for node in cluster.get("nodes", []):
        where = node.get("host") or node.get("ip") or node.get("node_id", "?")[:12]
        probe = node.get("probe") or {}
        if probe.get("reward_error"):
            problems.append(f"{where}: {probe['reward_error']}")
        elif "reward_error" not in probe:
            problems.append(f"{where}: the probe did not load it ({probe.get('error') or 'the probe task did not run'})")
        else:
            hosts.append(where)
    if problems:
        raise ConfigError(
            f"the reward file {reward} does not load on every node of the Ray cluster at {cluster.get('address')}, where "
            f"the trainer's actors load it by this path: {'; '.join(problems)}; put the file (and what it imports) at the "
            "same path on every node (a shared filesystem, or the same install of mentor[reward] in each node's Python), "
            "with the same PYTHONPATH in the environment `ray start` had there")
    return hosts


# --------------------------------------------------------------------------- the probe process


def _existing_address() -> str | None:
    """What ray.init() would join (None: it would start a local cluster), by Ray's own lookup."""
    try:
        from ray._private.services import canonicalize_bootstrap_address  # Ray: optional and slow to import
    except ImportError:  # a Ray without it: RAY_ADDRESS is the documented switch
        return os.environ.get("RAY_ADDRESS") or None
    return canonicalize_bootstrap_address(None)


def run_ray_init_of(entry: str) -> bool:
    """Run the ``ray.init`` statement of the function ``module:function`` (a trainer's driver, e.g. OpenRLHF's
    ``train()``, its runtime_env included), read from its source without importing the module; False when absent."""
    module, _, function = entry.partition(":")
    spec = find_spec(module) if find_spec(module.split(".")[0]) else None
    if spec is None or not spec.origin:
        return False
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    stmt = next((s for s in (func.body if func else []) if "ray.init" in ast.unparse(s)), None)
    if stmt is None:
        return False
    import ray  # optional and slow to import

    exec(compile(ast.Module(body=[stmt], type_ignores=[]), spec.origin, "exec"), {"ray": ray, "os": os})  # noqa: S102
    return True


def _load_reward(path: str, attribute: str) -> str | None:
    """Load the reward file by path, as the trainers' actors do; why it failed (None: it loaded)."""
    import importlib.util  # as OpenRLHF's SingleTurnAgentExecutor and verl's get_custom_reward_fn

    if not os.path.isfile(path):
        return f"{path} is not a file there"
    try:
        spec = importlib.util.spec_from_file_location("reward_func", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        getattr(module, attribute)
    except BaseException as exc:  # noqa: BLE001 - reported, not raised (SystemExit included)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"loading {path} fails ({type(exc).__name__}: {first}) in {sys.executable} (Python {platform.python_version()})"
    return None


def _probe(token: str, node_id: str, reward: list[str] | None = None) -> dict[str, Any]:
    """Runs in a Ray worker on one node: write a probe file where MENTOR_ROLLOUT_DIR points, load the reward file."""
    out: dict[str, Any] = {"host": socket.gethostname()}
    try:
        import mentor.training.reward_core  # noqa: F401 - what the reward file imports
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        out["mentor_error"] = f"{type(exc).__name__}: {exc}"
    if reward:
        out["reward_error"] = _load_reward(reward[0], reward[1])
    directory = os.environ.get(ENV_DIR)
    if not directory:
        out.update(ok=False, error=f"{ENV_DIR} is not set in the Ray workers' environment (the job's runtime env did not carry it)")
        return out
    path = Path(directory) / f"{PROBE_PREFIX}{token}-{node_id[:16]}.probe"
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"node_id": node_id, "host": out["host"]}) + "\n")
    except OSError as exc:
        out.update(ok=False, dir=directory, error=f"cannot write {directory} there ({type(exc).__name__}: {exc.strerror or exc})")
        return out
    out.update(ok=True, dir=directory, path=str(path))
    return out


_MISMATCH = re.compile(r"started with:\s*Ray: (\S+)\s*Python: (\S+)\s*This process on (.*?) was started with:\s*"
                       r"Ray: (\S+)\s*Python: (\S+)", re.S)


def version_mismatch(exc: BaseException, address: str, python: str | None = None) -> str | None:
    """Ray's version refusal (``ray._private.utils.check_version_info``) as one line naming both versions
    (`python`: the interpreter as the round config names it; default: this one)."""
    m = _MISMATCH.search(str(exc))
    if not m:
        return None
    c_ray, c_py, _, my_ray, my_py = m.groups()
    differs = " and ".join(w for w, a, b in (("Ray", c_ray, my_ray), ("Python", c_py, my_py)) if a != b) or "versions"
    return (f"{differs} version mismatch: the cluster at {address} runs Ray {c_ray} on Python {c_py}, the trainer's Python "
            f"({python or sys.executable}) has Ray {my_ray} on Python {my_py}, and Ray refuses to join a cluster of another Ray or "
            "Python version; run the round with a `python` that matches the cluster (the interpreter the cluster's "
            "`ray start` ran), or start the cluster from the trainer's environment")


def _run(init: str, token: str, timeout_s: float, runtime_env: dict | None = None,
         reward: list[str] | None = None, python: str | None = None) -> dict[str, Any]:
    import ray  # optional and slow to import
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # likewise

    address = _existing_address()
    if address is None:
        return {"cluster": None}
    try:
        if not (init != "plain" and run_ray_init_of(init)):
            ray.init(log_to_driver=False, runtime_env=runtime_env)
    except Exception as exc:  # noqa: BLE001 - Ray's version check is a RuntimeError
        why = version_mismatch(exc, address, python)
        if why is None:
            raise
        return {"error": why, "versions": {"ray": ray.__version__, "python": platform.python_version()}}
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(num_cpus=0)(_probe)
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)).remote(token, n["NodeID"], reward)
            for n in nodes
        ]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        report = []
        for n, ref in zip(nodes, refs):
            if ref in done:
                try:
                    probe = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a node whose worker cannot start
                    probe = {"ok": False, "error": f"the probe task failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"}
            else:
                probe = {"ok": False, "error": f"the probe task did not run within {timeout_s:.0f}s"}
            report.append({"node_id": n["NodeID"], "host": n.get("NodeManagerHostname"), "ip": n.get("NodeManagerAddress"),
                           "gpus": n.get("Resources", {}).get("GPU", 0), "probe": probe})
        return {"cluster": {
            "address": address,
            "gpus_total": ray.cluster_resources().get("GPU", 0),
            "gpus_free": ray.available_resources().get("GPU", 0),
            "nodes": report,
        }}
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mentor.training.ray_preflight", description=__doc__.splitlines()[0])
    p.add_argument("--init", default="plain", help="plain, or module:function whose ray.init statement joins")
    p.add_argument("--token", default=uuid.uuid4().hex[:12])
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--runtime-env", type=json.loads, default=None, help="the runtime env (JSON) of the trainer's ray.init")
    p.add_argument("--reward", nargs=2, metavar=("FILE", "FUNCTION"), default=None,
                   help="a reward file to load by path on every node, and the function it must define")
    p.add_argument("--python", default=None, help="this interpreter as the round config names it (for messages)")
    a = p.parse_args(argv)
    try:
        report = _run(a.init, a.token, a.timeout, a.runtime_env, a.reward, a.python)
    except Exception as exc:  # noqa: BLE001 - one line for the launcher
        report = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
