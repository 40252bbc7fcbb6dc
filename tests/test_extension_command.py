"""A command is one new file: a module with a top-level ``COMMANDS`` (name -> its --help line) and the click
command(s) it names, in ``workflows/cli/`` or as ``commands/<name>.py`` in a MENTOR_PLUGIN_PATH folder. No
list is edited: `mentor --help` lists it (without importing it) and `mentor <name>` runs it."""

from __future__ import annotations

import os
import sys

import polars as pl
import pytest
from click.testing import CliRunner
from toy_plugins import PLUGINS, mentor, write_plugins

from mentor.pipeline import plugins
from mentor.workflows.cli import cli, commands


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """The plugin folder: one file, commands/toy_count.py."""
    folder = write_plugins(tmp_path / "plugins", "command")
    for name in [m for m in sys.modules if m.startswith("mentor.plugins.commands.")]:  # an earlier test's folder
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setenv(plugins.PLUGIN_PATH_ENV, str(folder))
    return folder


def test_the_toy_command_is_listed_and_runs(toy, gsm8k_collapsed):
    r = mentor(os.environ | {plugins.PLUGIN_PATH_ENV: str(toy)}, "--help")
    assert r.returncode == 0, r.stderr
    listed = " ".join(r.stdout.split("Commands:", 1)[1].split())
    assert "toy-count Count the problems of collapsed datasets (a toy command from one plugin file)." in listed
    assert "mine Find collapsed problems" in listed  # the built-in ones are still there, in name order
    names = [line.split()[0] for line in r.stdout.split("Commands:", 1)[1].splitlines()
             if line.startswith("  ") and line[2:3].strip()]
    assert names == sorted(names) and "toy-count" in names
    res = CliRunner().invoke(cli, ["toy-count", str(gsm8k_collapsed)])
    assert res.exit_code == 0, res.output
    assert int(res.output.strip()) == pl.read_parquet(gsm8k_collapsed).height
    assert "Print how many problems" in CliRunner().invoke(cli, ["toy-count", "--help"]).output


def test_the_command_list_is_read_from_the_modules():
    """Every built-in command comes from its module's COMMANDS; the modules without one are parts (options)."""
    found = commands()
    assert {"ingest", "mine", "hint", "build", "run", "stage", "train", "doctor"} <= set(found)
    assert found["check-hint"][0] == "hint" and found["doctor"][0] == "setup" and found["mine"][0] == "mine"
    assert "options" not in {module for module, _ in found.values()}
    assert list(found) == sorted(found)


def _write(toy, source: str) -> None:
    (toy / PLUGINS["command"][0]).write_text(source)


def test_a_command_module_that_is_not_declared_well_is_one_line(toy):
    _write(toy, "COMMANDS = dict(toy='x')\n")
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 2, r.output
    assert f"{toy / 'commands' / 'toy_count.py'}:1: COMMANDS must be a literal dict" in r.output
    assert "Traceback" not in r.output

    _write(toy, 'COMMANDS = {"mine": "Mine again."}\n')
    r = CliRunner().invoke(cli, ["mine", "--help"])
    assert r.exit_code == 2 and "declares the command 'mine' that" in r.output and "rename one" in r.output, r.output

    _write(toy, 'COMMANDS = {"toy-missing": "Declared, never written."}\n')
    r = CliRunner().invoke(cli, ["toy-missing"])
    assert r.exit_code == 2, r.output
    assert "COMMANDS declares 'toy-missing' but the module has no click command of that name" in r.output
