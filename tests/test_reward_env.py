"""The reward files run where the trainers run, and fail loudly where they cannot.

- Without mentor importable (a trainer image on another Python, mentor not installed) the
  reward files fail at load, through OpenRLHF's and verl's own loaders, with one line that
  names the Python and the install command: never a silent reward of 0.
- Every launcher has the trainer's own Python (``python`` of the round) load the reward
  function before a round starts, and refuses the round when it cannot.
- The reward path (the three reward modules and every mentor module they import) needs no
  Python newer than 3.10 (vermin), and on a real Python 3.10 with ``pip install
  '.[reward]'`` the three entry points load and score real GSM8K and HumanEval answers.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mentor.workflows.cli import cli

REPO = Path(__file__).resolve().parents[1]
TRAINING = REPO / "training"
REWARD_FILES = {"openrlhf": TRAINING / "openrlhf" / "reward.py", "verl": TRAINING / "verl" / "reward.py"}

# A trainer's environment without mentor: every `mentor` import fails, as it would where it is not installed.
NO_MENTOR = """
import sys
class _NoMentor:
    def find_spec(self, name, path=None, target=None):
        if name == "mentor" or name.startswith("mentor."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoMentor())
"""


def _last_line(proc: subprocess.CompletedProcess) -> str:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]


@pytest.mark.openrlhf
def test_openrlhf_loading_the_reward_file_without_mentor_fails_loudly():
    pytest.importorskip("openrlhf")
    code = NO_MENTOR + textwrap.dedent(f"""
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        SingleTurnAgentExecutor(remote_rm_url=[{str(REWARD_FILES['openrlhf'])!r}])
        print("loaded")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "loaded" not in proc.stdout
    line = _last_line(proc)
    assert "mentor is not importable in the trainer's Python" in line
    assert sys.version.split()[0] in line and sys.executable in line and "pip install 'mentor[reward]'" in line


@pytest.mark.verl
def test_verl_loading_the_reward_file_without_mentor_fails_loudly():
    pytest.importorskip("verl")
    pytest.importorskip("hydra")
    code = NO_MENTOR + textwrap.dedent(f"""
        from hydra import compose, initialize_config_dir
        import verl, os
        from verl.trainer.ppo.reward import get_custom_reward_fn
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
            cfg = compose("ppo_trainer", overrides=["reward.custom_reward_function.path={REWARD_FILES['verl']}"])
        get_custom_reward_fn(cfg)
        print("loaded")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "loaded" not in proc.stdout
    assert "mentor is not importable in the trainer's Python" in proc.stderr
    assert "pip install 'mentor[reward]'" in proc.stderr


def _bare_python() -> str:
    """This Python without its virtualenv: no mentor, no packages (a trainer image that lacks mentor)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not base.is_file() or Path(sys.prefix) == Path(sys.base_prefix):
        pytest.skip("no interpreter without this environment's packages")
    return str(base)


@pytest.mark.parametrize("kind", ["openrlhf", "verl", "trl"])
def test_launchers_refuse_a_trainer_python_that_cannot_load_the_reward(kind, tmp_path, policy_model, gsm8k_prompts, monkeypatch):
    if kind in ("openrlhf", "verl", "trl"):
        pytest.importorskip({"openrlhf": "openrlhf", "verl": "verl", "trl": "trl"}[kind])
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "8")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    conf = {"round": 0, "round_dir": str(tmp_path / "round-000"), "base_model": policy_model, "prompts": gsm8k_prompts,
            "python": _bare_python()}
    if kind != "openrlhf":
        conf["kind"] = kind
    if kind == "verl":
        conf |= {"n_gpus_per_node": 8, "overrides": {"data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 32}}
    path = tmp_path / "round.yaml"
    path.write_text(yaml.safe_dump(conf))
    res = CliRunner().invoke(cli, ["train", "--config", str(path), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert f"the trainer's Python ({conf['python']}) cannot load the reward" in res.output
    assert "No module named 'mentor'" in res.output or "mentor is not importable" in res.output
    res = CliRunner().invoke(cli, ["train", "--config", str(path)])
    assert res.exit_code == 2 and "cannot load the reward" in res.output
    assert not (tmp_path / "round-000" / "train" / "train.log").exists()  # refused before the trainer started


def _reward_closure() -> list[Path]:
    """The files of every mentor module the three reward entry points import."""
    code = ("import sys, json\n"
            "import mentor.training.openrlhf.reward, mentor.training.verl.reward, mentor.training.trl.reward\n"
            "import mentor.training.verify, mentor.training.code_verify\n"
            "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() if n.startswith('mentor') and getattr(m, '__file__', None)})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return [Path(p) for p in json.loads(proc.stdout.strip().splitlines()[-1])]


def test_the_reward_path_needs_no_python_newer_than_310():
    vermin = shutil.which("vermin") or (Path(sys.executable).parent / "vermin")
    if not Path(vermin).exists():
        pytest.skip("vermin is not installed (the test extra has it)")
    files = _reward_closure()
    assert any(f.parent.name == "sandbox" for f in files) and any(f.name == "verify.py" for f in files)
    proc = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.10-", *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def _python310() -> str | None:
    """A working Python 3.10 interpreter (pyenv's, or one on PATH), else None."""
    cands = sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.10*/bin/python3.10"))
    cands += [c for c in [shutil.which("python3.10")] if c]
    for cand in cands:
        try:
            if subprocess.run([cand, "-c", "import venv"], capture_output=True, timeout=60).returncode == 0:
                return cand
        except OSError:
            continue
    return None


SCORE = r"""
import importlib.util, json, sys
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)  # how OpenRLHF and verl load a reward file
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
openrlhf, verl = load(sys.argv[1], "reward_func"), load(sys.argv[2], "custom_module")
from mentor.pipeline.schemas import prompt_label
from mentor.training.trl.reward import reward_func as trl
case = json.loads(sys.argv[3])
prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
out = {"version": sys.version.split()[0]}
for name, domain, ref, good, bad in (("math", "math", case["math_ref"], case["math_good"], "The answer is \\boxed{-7}."),
                                     ("code", "code", case["code_ref"], case["code_good"], "def f(:\n")):
    label = prompt_label(domain, ref, "p-" + name, None, 0)
    out[name] = {
        "openrlhf": [float(openrlhf.reward_func([prompt + t + "<|im_end|>"], [prompt], [label])["rewards"][0]) for t in (good, bad)],
        "verl": [float(verl.compute_score(name, t, ref if domain == "math" else json.loads(ref), {"problem_id": "p-" + name}))
                 for t in (good, bad)],
        "trl": trl(prompts=["Q", "Q"], completions=[good, bad], label=[label, label]),
    }
print(json.dumps(out))
"""


def test_the_reward_entry_points_run_on_python_310(tmp_path, shared_data):
    """A trainer image's Python 3.10 with `pip install '.[reward]'`: OpenRLHF's and verl's file loading and TRL's
    module, scoring a real GSM8K answer and a real HumanEval solution (in the sandbox) right and wrong."""
    py310 = _python310()
    if py310 is None:
        pytest.skip("no Python 3.10 here")
    venv = tmp_path / "py310"
    subprocess.run([py310, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{REPO}[reward]"], capture_output=True, text=True,
                         timeout=1800)
    if pip.returncode != 0 and ("Could not find a version" in pip.stderr or "connection" in pip.stderr.lower()):
        pytest.skip(f"the package index is out of reach: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    import polars as pl

    from mentor.data import bundled

    gsm = pl.read_parquet(bundled("gsm8k_problems.parquet")).row(0, named=True)
    he = pl.read_parquet(bundled("humaneval_problems.parquet")).row(0, named=True)
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        task = json.loads(fh.readline())
    assert task["entry_point"] == json.loads(he["label"])["entry_point"]
    solution = task["canonical_solution"]
    case = {"math_ref": gsm["label"], "math_good": f"So the answer is \\boxed{{{gsm['label']}}}.",
            "code_ref": he["label"], "code_good": f"```python\n{he['problem']}{solution}\n```"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))} | {"MENTOR_ROLLOUT_DIR": str(tmp_path / "logs")}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", SCORE, str(REWARD_FILES["openrlhf"]), str(REWARD_FILES["verl"]),
                           json.dumps(case)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"].startswith("3.10.")
    for domain in ("math", "code"):
        for entry in ("openrlhf", "verl", "trl"):
            assert got[domain][entry] == [1.0, 0.0], (domain, entry, got)
    assert len(list((tmp_path / "logs").glob("*.jsonl"))) >= 3  # every entry point logged its rollouts
