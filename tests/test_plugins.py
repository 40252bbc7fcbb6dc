"""The extension-point folders (`mentor.pipeline.plugins`): members by file name, plugins from MENTOR_PLUGIN_PATH."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError
from mentor.workflows.cli import cli


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "toy_stage.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Thing:\n    n: int\n\nSTAGE = Thing(7)\n")
    (tmp_path / "trainers" / "toy_trainer").mkdir(parents=True)
    (tmp_path / "trainers" / "toy_trainer" / "launcher.py").write_text("LAUNCHER = 'toy'\n")
    (tmp_path / "trainers" / "not_a_trainer").mkdir()  # no launcher.py: not a member
    monkeypatch.setenv(plugins.PLUGIN_PATH_ENV, str(tmp_path))
    return tmp_path


def test_builtin_members_are_listed_without_import():
    import sys

    assert "mine" in plugins.names("stages")
    sys.modules.pop("mentor.stages.rescue", None)
    assert "rescue" in plugins.names("stages") and "mentor.stages.rescue" not in sys.modules


def test_plugins_join_their_point(plugin_dir):
    assert plugins.names("stages")[-1] == "toy_stage"
    assert plugins.names("trainers")[-1:] == ["toy_trainer"]
    assert plugins.load("stages", "toy_stage").STAGE.n == 7
    assert plugins.load("trainers", "toy_trainer").LAUNCHER == "toy"
    with pytest.raises(KeyError, match="no trainer 'not_a_trainer'"):
        plugins.load("trainers", "not_a_trainer")


def test_a_plugin_cannot_take_a_builtin_name(plugin_dir):
    (plugin_dir / "stages" / "mine.py").write_text("STAGE = None\n")
    with pytest.raises(ConfigError, match="built-in stage name 'mine'"):
        plugins.names("stages")


def test_what_a_plugin_declares_pickles_into_another_process(plugin_dir):
    """A dask worker or a spawned engine process unpickles a plugin's objects by its import name."""
    thing = plugins.load("stages", "toy_stage").STAGE
    out = subprocess.run([sys.executable, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).n)"],
                         input=pickle.dumps(thing), capture_output=True, env=os.environ.copy(), timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "7"


# A plugin that does not parse or import: (point, its file, its source, the line named, the exception, a mentor command)
BROKEN = [
    ("stages", "stages/broken_stage.py", "import json\n\nSTAGE = (1,\n", 3, "SyntaxError: '(' was never closed",
     ["stage", "broken_stage", "--out", "{tmp}/o"]),
    ("stages", "stages/raising_stage.py", '"""A stage."""\nraise RuntimeError("no settings here")\nSTAGE = None\n', 2,
     "RuntimeError: no settings here", ["stage", "raising_stage", "--out", "{tmp}/o"]),
    ("backends", "backends/broken_backend.py", '"""A backend."""\nimport no_such_module_xyz\nBACKEND = None\n', 2,
     "ModuleNotFoundError: No module named 'no_such_module_xyz'",
     ["hint", "{tmp}/c.parquet", "--out", "{tmp}/h", "--backend", "broken_backend"]),
    ("backends", "backends/syntax_backend.py", "BACKEND = [\n", 1, "SyntaxError: '[' was never closed",
     ["rollout", "{tmp}/p", "--out", "{tmp}/r", "--backend", "syntax_backend"]),
    ("rules", "rules/broken_rule.py", "x = 1\nraise ValueError('a rule that cannot load')\n", 2,
     "ValueError: a rule that cannot load", ["check-hint", "Name the quantity asked for first.", "--answer", "3"]),
    ("trainers", "trainers/broken_trainer/launcher.py", "LAUNCHER = None\n1 / 0\n", 2, "ZeroDivisionError: division by zero",
     ["train", "--config", "{tmp}/round.yaml", "--dry-run"]),
    ("commands", "commands/broken_command.py", 'COMMANDS = {"broken-command": "x"}\nimport no_such_module_xyz\n', 2,
     "ModuleNotFoundError: No module named 'no_such_module_xyz'", ["broken-command"]),
]


@pytest.mark.parametrize(("point", "file", "source", "line", "exception", "args"), BROKEN,
                         ids=[f"{b[0]}-{b[1].split('/')[1].removesuffix('.py')}" for b in BROKEN])
def test_a_plugin_that_does_not_import_is_one_config_error(tmp_path, monkeypatch, point, file, source, line, exception,
                                                           args):
    """Through `mentor`: exit 2 and one line naming the file and line, the point, the exception and the fix."""
    folder = tmp_path / "plugins"
    (folder / file).parent.mkdir(parents=True)
    (folder / file).write_text(source)
    (tmp_path / "round.yaml").write_text("kind: broken_trainer\n")
    monkeypatch.setenv(plugins.PLUGIN_PATH_ENV, str(folder))
    res = CliRunner().invoke(cli, [a.format(tmp=tmp_path) for a in args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, (SyntaxError, ImportError))
    assert res.output.strip().splitlines()[-1] == (
        f"Error: {folder / file}:{line}: the {point} plugin {file.split('/')[1].removesuffix('.py')!r} "
        f"({plugins.PLUGIN_PATH_ENV}) fails to import: {exception}; fix the file, or remove it or its folder from "
        f"{plugins.PLUGIN_PATH_ENV}")


def test_a_builtin_declaration_is_read_as_from_the_whole_module():
    """mentor's own modules are parsed only around the declaration (`plugins.declared`: the statements that assign
    it, a few ms less per module and per `mentor` command); what it reads is what a parse of the whole module says,
    for every declaration of every built-in member of every extension point."""
    import ast

    checked = 0
    for point in plugins.POINTS:
        for name in plugins.names(point):
            path = plugins.source(point, name)
            if path is None:
                continue
            tree = ast.parse(path.read_bytes())
            for attr in ("COMMANDS", "STAGE", "BACKEND", "LAUNCHER", "AGENT", "TITLE", "RESPONSE_LIMIT_KEY"):
                ast.parse(plugins.declaration_text(path.read_bytes(), attr.encode()))  # the cut parses: no fallback
                whole = None
                for node in tree.body:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
                    if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                        whole = node.value
                read = plugins.declared(point, name, attr)
                assert (ast.dump(read) if read is not None else None) == (ast.dump(whole) if whole is not None else None), \
                    (point, name, attr)
                assert read is None or read.lineno == whole.lineno
                checked += whole is not None
    assert checked >= 30  # 33 when written: the commands, stages, backends, trainers and agents
