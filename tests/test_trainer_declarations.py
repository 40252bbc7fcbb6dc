"""What the shared code knows of a trainer, it reads from the trainer's declarations (docs/architecture.md).

- No trainer kind (nor the train stage's own kinds, ``offline`` and ``external``), and no backend kind, is written
  as a value in code outside its own files: the static scans below, over every room.
- Live hints: the hint stage's one live-hints entry (`stages/hint/live.py`) knows no trainer. A toy trainer
  whose launcher declares a live hook (a plugin folder, ``MENTOR_PLUGIN_PATH``) gets the hint call through
  the entry, as a process (``python -m mentor.stages.hint.live KIND ...``) and from the entry's file loaded by
  path (``MENTOR_LIVE_TRAINER``, as OpenRLHF loads it).
- Log formats: a format the toy trainer declares (``log_formats``) is one of `mentor ingest`'s, read and
  sniffed (``--format auto``) like the built-in ones.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from toy_plugins import mentor

from mentor.data import bundled
from mentor.stages.hint.live import hinted_messages
from mentor.training.live_hints import LiveHintsConfig, live_entry_file

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("pipeline", "data", "training", "stages", "workflows")
TRAINERS = ("openrlhf", "trl", "verl")
OWN_KINDS = {"offline": "stages/train.py", "external": "stages/train.py"}
# Values that are a trainer's name for another reason, each with why it stays.
KEPT = {
    ("pipeline/schemas.py", "openrlhf"): "RECORDS_FORMAT: the name of mentor's own record format (`ingest --format "
                                         "openrlhf`, workflow files), after the first trainer that wrote it",
}
# Backend kinds' names as values outside pipeline/backends/<kind>: the trainers' own rollout engines (their configs
# name their vLLM), and the default kind.
BACKEND_KEPT = {
    ("pipeline/backends/__init__.py", "vllm"): "DEFAULT: the kind of a setting or a command that names none",
    ("training/openrlhf/placement.py", "vllm"): "OpenRLHF's own rollout engines (its `vllm` placement), not mentor's",
    ("training/verl/config.py", "vllm"): "verl's own rollout engine (`rollout.name: vllm`), not mentor's",
}

TOY_LAUNCHER = '''
from typing import ClassVar

from mentor.pipeline.ids import text_id
from mentor.pipeline.log_rows import LogFormat, iter_jsonl, number, rollout_table, rows_of, text
from mentor.training.launcher import LauncherBase, RoundConfig


def read_toylog(path, round_, domain, stats, seen):
    def make(lineno, rec):
        pid = text_id(rec["q"])
        idx = seen[pid]
        seen[pid] += 1
        return {"problem_id": pid, "round": round_, "sample_idx": idx, "problem": rec["q"], "prompt": rec["q"],
                "response": text(rec["a"]), "correct": number(rec["ok"]), "reward": number(rec["ok"]), "domain": domain,
                "label": None, "source": "toylog", "step": None}

    return rollout_table(rows_of(path, stats, iter_jsonl(path, stats), make))


class ToyLiveConfig(RoundConfig):
    pass


class ToyLiveLauncher(LauncherBase):
    kind: ClassVar[str] = "toylive"
    Config: ClassVar[type[ToyLiveConfig]] = ToyLiveConfig
    live: ClassVar[str] = "mentor.plugins.trainers.toylive.live"
    log_formats: ClassVar[tuple] = (LogFormat("toylog", "the toy trainer's own logs", frozenset({"q", "a", "ok"}),
                                              read_toylog),)


LAUNCHER = ToyLiveLauncher()
'''

TOY_HOOK = '''
import json

from mentor.training.live_hints import LiveHintsConfig


def main(argv, hinter):
    cfg = LiveHintsConfig.model_validate(json.loads(open(argv[0]).read()))
    messages = hinter(cfg).messages("What is 2 + 3?", "Add the two numbers.", "math",
                                    [{"role": "user", "content": "What is 2 + 3?"}])
    open(argv[1], "w").write(json.dumps(messages))
    return 0


def thing(hinter):
    return {"hinter": hinter.__name__}


FILE_EXPORTS = {"Thing": thing}
'''

LIVE = {"backend": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}


def _values(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant in the code of `path` that is not a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _code_files():
    """(path relative to the repository, path) of every module of the five rooms."""
    for room in ROOMS:
        for f in sorted((REPO / room).rglob("*.py")):
            yield f.relative_to(REPO).as_posix(), f


def test_no_kind_is_written_outside_its_own_files():
    """A trainer's kind as a value (a branch, a table, a default) only in ``training/<kind>/``; the train stage's own
    kinds only in stages/train.py. Prose (help texts, messages, docstrings) may name them."""
    found = []
    for rel, f in _code_files():
        for line, value in _values(f):
            name = value.lower()
            if name in TRAINERS and not rel.startswith(f"training/{name}/") and (rel, name) not in KEPT:
                found.append(f"{rel}:{line} {value!r}")
            if name in OWN_KINDS and rel != OWN_KINDS[name]:
                found.append(f"{rel}:{line} {value!r}")
    assert not found, "kinds written by name outside their own files:\n" + "\n".join(found)


def test_no_backend_kind_is_written_outside_its_own_files():
    """A backend kind's name as a value only in its own module or package (``pipeline/backends/<kind>``): `mentor
    doctor`, `mentor serve` and `mentor setup-cpu` ask the kinds' declarations (`node_checks`, `serve_command`,
    `cpu_setup`). Before: setup.py held vLLM's CPU conflicts and served through the vllm module by name."""
    from mentor.pipeline import backends

    kinds, found = backends.kinds(), []
    for rel, f in _code_files():
        found += [f"{rel}:{line} {value!r}" for line, value in _values(f) if value.lower() in kinds
                  and not rel.startswith(f"pipeline/backends/{value.lower()}") and (rel, value.lower()) not in BACKEND_KEPT]
        imported = {n.module or "" for n in ast.walk(ast.parse(f.read_text(), str(f))) if isinstance(n, ast.ImportFrom)}
        found += [f"{rel}: imports {m}" for m in imported if m.startswith("mentor.pipeline.backends.")
                  and not rel.startswith("pipeline/backends/")]
    assert not found, "backend kinds named outside their own files:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict:
    """A plugin folder with the toy trainer (its launcher and its live hook), and the env that finds it."""
    d = tmp_path_factory.mktemp("toylive")
    folder = d / "plugins" / "trainers" / "toylive"
    folder.mkdir(parents=True)
    (folder / "launcher.py").write_text(TOY_LAUNCHER)
    (folder / "live.py").write_text(TOY_HOOK)
    env = os.environ | {"MENTOR_PLUGIN_PATH": str(d / "plugins")}
    env.pop("MENTOR_LIVE_TRAINER", None)
    return {"dir": d, "env": env}


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_live_entry_runs_any_trainers_hook_with_the_hint_call(toy, tmp_path):
    cfg = tmp_path / "live.json"
    cfg.write_text(json.dumps(LIVE))
    res = _python(toy["env"], "-m", "mentor.stages.hint.live", "toylive", str(cfg), str(tmp_path / "out.json"))
    assert res.returncode == 0, res.stderr
    got = json.loads((tmp_path / "out.json").read_text())
    original = [{"role": "user", "content": "What is 2 + 3?"}]
    assert got == hinted_messages(LiveHintsConfig.model_validate(LIVE), "What is 2 + 3?", "Add the two numbers.", "math",
                                  original)
    assert "Add the two numbers." in got[-1]["content"]  # build's rendering of the placement, through the hint call

    bad = _python(toy["env"], "-m", "mentor.stages.hint.live")
    assert bad.returncode == 2 and "usage: python -m mentor.stages.hint.live KIND ARGS" in bad.stderr
    bad = _python(toy["env"], "-m", "mentor.stages.hint.live", "verl", str(cfg))
    assert bad.returncode == 2 and "trainer kind verl: it has no live hints" in bad.stderr
    assert "live hints run in openrlhf, trl, toylive" in bad.stderr  # from the launchers' declarations


def test_the_live_entrys_file_gives_the_names_the_hook_exports(toy):
    """Loaded by path, as OpenRLHF loads an agent file: the trainer named by MENTOR_LIVE_TRAINER gets its hook's names."""
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("agent_module", {str(live_entry_file())!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            print(json.dumps(module.Thing))
        except AttributeError as exc:
            print("AttributeError:", exc)
    """)
    res = _python(toy["env"] | {"MENTOR_LIVE_TRAINER": "toylive"}, "-c", code)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"hinter": "LiveHinter"}
    res = _python(toy["env"], "-c", code)
    assert res.returncode == 0 and "MENTOR_LIVE_TRAINER is not set" in res.stdout
    res = _python(toy["env"] | {"MENTOR_LIVE_TRAINER": "toylive"}, "-c", code.replace("module.Thing", "module.Other"))
    assert "trainer toylive's live hook exports Thing from this file" in res.stdout


def test_a_trainers_log_format_is_one_of_ingests(toy, tmp_path):
    """The toy trainer's declared format: `mentor ingest --format toylog` reads it, and --format auto finds it."""
    problems = pl.read_parquet(bundled("gsm8k_problems.parquet")).sort("problem_id").head(5)
    log = tmp_path / "toy.jsonl"
    lines = [{"q": q, "a": f"answer {i}", "ok": i % 2} for q in problems["problem"] for i in range(3)]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    helped = mentor(toy["env"], "ingest", "--help")
    assert helped.returncode == 0 and "toylog" in helped.stdout
    for fmt in ("toylog", "auto"):
        res = mentor(toy["env"], "ingest", str(log), "--format", fmt, "--out", str(tmp_path / fmt))
        assert res.returncode == 0, res.stderr
        df = pl.read_parquet(tmp_path / fmt / "part-00000.parquet")
        assert df.height == 15 and df["problem_id"].n_unique() == 5 and set(df["source"]) == {"toylog"}
        assert sorted(df["sample_idx"].unique().to_list()) == [0, 1, 2] and df["correct"].sum() == 5
        assert set(df["problem"]) == set(problems["problem"])
    stats = json.loads((tmp_path / "auto" / "stats.json").read_text())
    assert stats["format"] == "toylog"
