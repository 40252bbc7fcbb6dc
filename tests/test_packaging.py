"""Packaging: one `mentor` namespace, no generic top-level packages, a complete --help."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from click.testing import CliRunner

from mentor.workflows.cli import cli, commands

REPO = Path(__file__).resolve().parents[1]


def test_help_lists_every_command_with_one_line():
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    found = commands()  # read from each module's COMMANDS
    assert len(found) >= 18
    for name, (_, help_line) in found.items():
        assert name in res.output
        assert help_line and "\n" not in help_line
    for name in found:  # every declared command imports, is the click command of that name and has --help
        assert cli.get_command(None, name).name == name
        sub = CliRunner().invoke(cli, [name, "--help"])
        assert sub.exit_code == 0, (name, sub.output)


def test_wheel_maps_folders_into_the_mentor_namespace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
    )
    wheel = next(tmp_path.glob("mentor-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"mentor", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    for pkg in ("pipeline", "stages", "training", "workflows", "workflows/cli", "data"):
        assert f"mentor/{pkg}/__init__.py" in names
    # A subpackage ships only when pyproject's [tool.setuptools] packages lists it.
    for top in ("pipeline", "stages", "training", "workflows", "data"):
        for init in (REPO / top).rglob("*/__init__.py"):
            rel = init.relative_to(REPO)
            if "_namespace" not in rel.parts:  # pipeline/_namespace is the `mentor` package itself
                assert f"mentor/{rel.as_posix()}" in names, f"{init.parent} missing from the wheel"
    # The tree is the import path: the command line is workflows/cli/, mentor.workflows.cli (not in the core).
    assert "mentor/workflows/cli/__main__.py" in names and not any(n.startswith(("mentor/pipeline/cli", "mentor/cli/")) for n in names)
    assert "mentor/data/gsm8k_rollouts.parquet" in names
    # The hint agents' prompts ship beside the agents (a wheel without them cannot hint).
    templates = sorted(p.name for p in (REPO / "stages" / "hint" / "agents").glob("*.txt"))
    assert templates and all(f"mentor/stages/hint/agents/{t}" in names for t in templates)
    assert all(f"mentor/stages/hint/agents/{a}.py" in names for a in ("attribution", "generation", "judgment", "repair"))
    assert not any(n.startswith("mentor/tests") for n in names)


def test_generic_names_not_importable_outside_the_repo(tmp_path):
    code = (
        "import importlib.util as u, mentor.pipeline, mentor.stages;"
        "print([n for n in ('pipeline','stages','training','workflows') if u.find_spec(n)])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_imports_no_stage_and_no_engine(tmp_path):
    """`mentor --help` lists the commands without importing a command module, a stage, polars or vLLM."""
    code = (
        "import sys; from mentor.workflows.cli import cli\n"
        "try:\n    cli(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('polars', 'pyarrow', 'vllm', 'torch', 'distributed')"
        " or m.startswith(('mentor.stages', 'mentor.workflows.cli.'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
