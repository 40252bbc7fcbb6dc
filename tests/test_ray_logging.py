"""Rollout logs from every Ray node, with a real Ray head started here (CPU only, fake GPU resources).

The head is `ray start --head --block` in its own session (GPU=8 declared, no GPU
used), stopped at the end by terminating that process (its children follow);
nothing is matched by name. What the trainer does is done with the real pieces:

- the driver runs the ``ray.init(...)`` statement of OpenRLHF's own ``train()``,
  read from the installed source, in the environment `mentor train` gives the
  trainer;
- the reward file is loaded in a Ray actor by OpenRLHF's ``SingleTurnAgentExecutor``
  (as its vLLM engine actor ``RolloutRayActor`` does) and its ``reward_func`` called
  with one sample, as the engine's executor calls it;
- `mentor ingest --format openrlhf` reads the log back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

try:
    import ray  # noqa: F401
except ImportError:  # pragma: no cover - ray is in the test extra
    pytest.skip("ray is not installed (pip install ray: part of the test extra)", allow_module_level=True)
pytest.importorskip("openrlhf", reason="openrlhf is not installed (mentor setup-cpu --openrlhf)")

from mentor.workflows.cli import cli  # noqa: E402
from mentor.data import bundled  # noqa: E402
from mentor.pipeline.schemas import prompt_label  # noqa: E402
from mentor.training.openrlhf.launcher import REWARD_FILE, TrainConfig, build_env, preflight, build_command, run_round  # noqa: E402
from mentor.pipeline.errors import ConfigError  # noqa: E402
from mentor.training.rollout_log import RAY_JOB_CONFIG_ENV, RolloutDirUnreachable  # noqa: E402

from fake_trainers import fake_trainer  # noqa: E402

pytestmark = [pytest.mark.openrlhf, pytest.mark.ray]

# Stands in for `python -m openrlhf.cli.train_ppo_ray` once the checks let it start.
FAKE_TRAINER = """out = sys.argv[sys.argv.index("--ckpt.output_dir") + 1]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "started"), "w").write(os.environ.get("RAY_ADDRESS", ""))
"""

# The trainer's side: OpenRLHF's own ray.init statement, then the reward file in a Ray actor.
DRIVER = r"""
import json, sys
import ray
from mentor.training.openrlhf.launcher import RAY_INIT
from mentor.training.ray_preflight import run_ray_init_of

assert run_ray_init_of(RAY_INIT), "OpenRLHF's train() has no ray.init statement"

@ray.remote(num_cpus=0)
class Engine:  # where OpenRLHF's RolloutRayActor runs the reward function
    def __init__(self, reward_file):
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        self.executor = SingleTurnAgentExecutor(remote_rm_url=[reward_file])

    def score(self, query, prompt, label):
        import os, socket
        out = self.executor.reward_func([query], [prompt], [label])
        return float(out["rewards"][0]), os.environ.get("MENTOR_ROLLOUT_DIR"), socket.gethostname()

samples = json.loads(sys.argv[2])
engine = Engine.remote(sys.argv[1])
print(json.dumps(ray.get([engine.score.remote(*s) for s in samples])))
ray.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(temp_dir: Path, *args: str, wrap: list[str] | None = None) -> subprocess.Popen:
    cmd = [shutil.which("ray") or str(Path(sys.executable).parent / "ray"), "start", "--block", "--disable-usage-stats",
           "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()), *args]
    log = open(temp_dir / f"ray-start-{len(list(temp_dir.glob('ray-start-*')))}.log", "wb")
    return subprocess.Popen((wrap or []) + cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to our `ray start --block` (it stops the node's processes), then its session if need be."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group this test started (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="module", autouse=True)
def _no_token_auth():
    """Ray >= 2.5x turns token auth on for a new local cluster and writes ~/.ray/auth_token, which a
    later `ray start` then requires: these throwaway clusters keep it off and leave the home folder alone."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        yield


@pytest.fixture(scope="module")
def ray_head(_no_token_auth):
    temp = Path(tempfile.mkdtemp(prefix="mray", dir="/tmp"))  # short: Ray's unix sockets live here
    port = _free_port()
    head = _ray_start(temp, "--head", "--temp-dir", str(temp), "--port", str(port), "--num-cpus", "2", "--num-gpus", "8",
                      "--include-dashboard=false")
    procs = [head]
    deadline = time.monotonic() + 120
    while not (temp / "ray_current_cluster").exists():
        if head.poll() is not None or time.monotonic() > deadline:
            _stop(head)
            pytest.fail(f"ray start --head did not come up: {(temp / 'ray-start-0.log').read_text()[-2000:]}")
        time.sleep(0.5)
    try:
        yield {"address": f"127.0.0.1:{port}", "temp": temp, "procs": procs}
    finally:
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture()
def round_inputs(policy_model, gsm8k_prompts) -> dict[str, str]:
    """A round that launches measures its prompts with the policy's tokenizer: real ones."""
    return {"base_model": policy_model, "prompts": gsm8k_prompts}


def _cfg(tmp_path: Path, inputs: dict[str, str] | None = None, **kw) -> TrainConfig:
    return TrainConfig(round=0, round_dir=str(tmp_path / "shared" / "round-000"),
                       python=fake_trainer(tmp_path / "fake-trainer", FAKE_TRAINER), **(inputs or {"base_model": "base/model"}),
                       **kw)


def _samples() -> list[list[str]]:
    row = pl.read_parquet(bundled("math500_problems.parquet")).filter(pl.col("label") == r"\frac{14}{3}").row(0, named=True)
    prompt = f"<|im_start|>user\n{row['problem']}<|im_end|>\n<|im_start|>assistant\n"
    label = prompt_label("math", row["label"], row["problem_id"], "h-1", 0)
    return [[prompt + r"So the answer is \boxed{\frac{14}{3}}.<|im_end|>", prompt, label],
            [prompt + r"So the answer is \boxed{5}.<|im_end|>", prompt, label]]


def _drive(env: dict[str, str], timeout: int = 240) -> list:
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(REWARD_FILE), json.dumps(_samples())], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ingest(log_dir: Path, out: Path) -> pl.DataFrame:
    res = CliRunner().invoke(cli, ["ingest", str(log_dir), "--format", "openrlhf", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return pl.read_parquet(out / "*.parquet")


def test_existing_cluster_reward_logs_reach_the_round_dir(ray_head, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    cfg = _cfg(tmp_path)
    trainer_env = dict(os.environ) | build_env(cfg)
    results = _drive(trainer_env)
    assert [r[0] for r in results] == [1.0, 0.0]
    assert {r[1] for r in results} == {str(cfg.rollout_dir)}  # the actor's worker got the round's dir
    df = _ingest(cfg.rollout_dir, tmp_path / "ingested")
    assert df.height == 2 and sorted(df["correct"].to_list()) == [0.0, 1.0] and set(df["hint_id"]) == {"h-1"}

    # Without the job's runtime env (the launcher's environment only), a `ray start` cluster's
    # workers never see MENTOR_ROLLOUT_DIR: the rollouts are scored but not logged.
    bare_dir = tmp_path / "bare"
    bare = dict(os.environ) | {"MENTOR_ROLLOUT_DIR": str(bare_dir)}
    assert {r[1] for r in _drive(bare)} == {None}
    assert not bare_dir.exists() or not list(bare_dir.glob("*.jsonl"))


def test_round_start_checks_the_cluster_gpus_and_log_dir(ray_head, tmp_path, monkeypatch, round_inputs):
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    monkeypatch.delenv("MENTOR_FAKE_GPUS", raising=False)
    cfg = _cfg(tmp_path, actor_gpus_per_node=2, ref_gpus_per_node=2, vllm_num_engines=2)
    checked = preflight(cfg, build_command(cfg), build_env(cfg))
    assert checked["ray_cluster"] and checked["gpus_there"] == 8 and checked["gpus_needed"] == 6
    assert checked["rollout_dir_checked_on"] == [socket.gethostname()]
    assert not list(cfg.rollout_dir.glob(".mentor-probe-*"))  # probes cleaned up

    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(_cfg(tmp_path, round_inputs, actor_gpus_per_node=8, ref_gpus_per_node=8,
                                       vllm_num_engines=8).model_dump()))
    res = CliRunner().invoke(cli, ["train", "--config", str(big)])
    assert res.exit_code == 2, res.output
    assert "this round needs 24 GPUs (8 actor + 8 reference + 8 vLLM: 8 engines x TP 1)" in res.output
    assert "the Ray cluster at" in res.output and "has 8" in res.output
    assert "set extra_args 'train.colocate_all': true (then it needs 8)" in res.output
    assert not (cfg.train_path / "model").exists()  # nothing launched


def test_unwritable_log_dir_refuses_the_round(ray_head, tmp_path, monkeypatch, round_inputs):
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    (tmp_path / "a-file").write_text("not a folder")
    cfg = _cfg(tmp_path, round_inputs, rollout_log_dir=str(tmp_path / "a-file" / "log"))
    with pytest.raises(RolloutDirUnreachable) as err:
        run_round(cfg)
    msg = str(err.value)
    assert "not reachable from every node" in msg and "cannot write" in msg and str(tmp_path / "a-file" / "log") in msg
    assert not (cfg.train_path / "model").exists() and not (cfg.train_path / "outcome.json").exists()


def test_fresh_local_cluster_gets_the_settings_too(tmp_path, monkeypatch):
    # No RAY_ADDRESS and an empty Ray temp dir: OpenRLHF's ray.init() starts a local cluster of its own.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = _cfg(tmp_path)
    ray_tmp = Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp"))
    try:
        env = dict(os.environ) | build_env(cfg) | {"RAY_TMPDIR": str(ray_tmp)}
        assert "MENTOR_ROLLOUT_DIR" in json.loads(env[RAY_JOB_CONFIG_ENV])["runtime_env"]["env_vars"]
        results = _drive(env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert {r[1] for r in results} == {str(cfg.rollout_dir)}
    assert _ingest(cfg.rollout_dir, tmp_path / "ingested").height == 2


def test_node_with_its_own_disk_refuses_the_round(ray_head, tmp_path, monkeypatch, round_inputs):
    """A second node whose view of the run folder is a disk of its own (a private mount namespace
    with a tmpfs over it): its probe lands where this machine cannot read, so the round refuses."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m (a private mount namespace, as root) is not available here")
    shared = tmp_path / "shared"
    shared.mkdir()
    worker = _ray_start(ray_head["temp"], "--address", ray_head["address"], "--num-cpus", "1", "--num-gpus", "0",
                        wrap=["unshare", "-m", "sh", "-c", f"mount -t tmpfs none {shared} && exec \"$0\" \"$@\""])
    ray_head["procs"].append(worker)
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    log = sorted(ray_head["temp"].glob("ray-start-*.log"))[-1]
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text(errors="replace"):  # `ray start` prints it once the node joined
        if worker.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the second Ray node did not join: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    cfg = _cfg(tmp_path, round_inputs)
    with pytest.raises(RolloutDirUnreachable) as err:
        run_round(cfg)
    msg = str(err.value)
    assert "which this machine cannot see (a disk local to that node)" in msg
    assert "a filesystem every node mounts" in msg
    assert not (cfg.train_path / "model").exists()


# A trainer environment whose Ray is another release than the cluster's (vLLM's CUDA wheels and OpenRLHF pin
# different Rays): this interpreter, with ``ray.__version__`` read as 2.59.0, the value Ray's own version check
# (``ray._private.utils.compute_version_info``) compares with the cluster's.
OTHER_RAY = """#!{python}
import runpy, sys
import ray
ray.__version__ = "2.59.0"
if sys.argv[1:2] == ["-c"]:
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {{"__name__": "__main__"}})
elif sys.argv[1:2] == ["-m"] and sys.argv[2].startswith("mentor."):  # mentor's checks: this interpreter
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:  # the trainer: it must never start
    out = sys.argv[sys.argv.index("--ckpt.output_dir") + 1]
    __import__("os").makedirs(out, exist_ok=True)
    open(out + "/started", "w").write("started")
"""


def test_a_trainer_python_with_another_ray_is_refused_naming_both_versions(ray_head, tmp_path, monkeypatch, round_inputs):
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    python = tmp_path / "trainer-python"
    python.write_text(OTHER_RAY.format(python=sys.executable))
    python.chmod(0o755)
    cfg = _cfg(tmp_path, round_inputs).model_copy(update={"python": str(python)})
    with pytest.raises(ConfigError) as err:
        run_round(cfg)
    msg = str(err.value)
    assert "Ray version mismatch" in msg and ray_head["address"] in msg
    py = ".".join(map(str, sys.version_info[:3]))
    assert f"runs Ray {ray.__version__} on Python {py}, the trainer's Python ({python}) has Ray 2.59.0 on Python {py}" in msg
    assert not (cfg.train_path / "model").exists() and not (cfg.train_path / "outcome.json").exists()


def test_the_reward_file_is_loaded_on_every_node(ray_head, tmp_path, monkeypatch):
    """A reward file that imports a helper from the launcher's PYTHONPATH loads here (the launcher's own check)
    but not in the Ray workers, whose environment is the one `ray start` had: refused before launch."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "my_reward_helpers.py").write_text("def score(*_):\n    return 1.0\n")
    reward = tmp_path / "my_reward.py"
    reward.write_text("import my_reward_helpers\n\ndef reward_func(queries, prompts, labels):\n"
                      "    return {'rewards': [my_reward_helpers.score(q) for q in queries]}\n")
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    monkeypatch.setenv("PYTHONPATH", str(helpers))
    cfg = _cfg(tmp_path, reward_file=str(reward))
    with pytest.raises(ConfigError) as err:
        preflight(cfg, build_command(cfg), build_env(cfg))
    msg = str(err.value)
    assert f"the reward file {reward} does not load on every node of the Ray cluster at " in msg
    assert f"{socket.gethostname()}: loading {reward} fails (ModuleNotFoundError: No module named 'my_reward_helpers')" in msg
    assert "same PYTHONPATH" in msg
    # mentor's own reward file loads on every node
    cfg = _cfg(tmp_path)
    assert preflight(cfg, build_command(cfg), build_env(cfg))["ray_cluster"]
