"""The extension-point folders (`mentor.pipeline.plugins`): members by file name, plugins from MENTOR_PLUGIN_PATH."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError


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
