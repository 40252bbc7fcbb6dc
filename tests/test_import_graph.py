"""The tree is the import path, and each room imports only the rooms below it (docs/architecture.md).

The static import graph (ast, every ``import mentor.<room>...`` / ``from mentor.<room>... import``
in the five rooms, including imports inside functions) is checked against the layering the
architecture page states:

    pipeline  <  data  <  training  <  stages  <  workflows

pipeline depends on nothing of mentor's; each room above may import the rooms below it, and no import goes
upward (no allow-list). Code a lower room starts by name rather than imports (the hint stage's live-hints entry,
which the TRL and OpenRLHF launchers start as a process module or a file OpenRLHF loads by path) is checked to exist
where the launcher names it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORDER = ("pipeline", "data", "training", "stages", "workflows")  # each may import only those before it

def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _graph() -> list[tuple[str, int, str, str, str]]:
    """(file, line, module imported, from room, to room) for every import of another room."""
    edges = []
    for room in ORDER:
        for f in sorted((REPO / room).rglob("*.py")):
            for line, mod in _imports(f):
                parts = mod.split(".")
                if parts[0] == "mentor" and len(parts) > 1 and parts[1] in ORDER and parts[1] != room:
                    edges.append((str(f.relative_to(REPO)), line, mod, room, parts[1]))
    return edges


def test_pipeline_depends_on_nothing_of_mentors():
    up = [e for e in _graph() if e[3] == "pipeline"]
    assert not up, "pipeline/ imports other rooms:\n" + "\n".join(f"{f}:{n} {m}" for f, n, m, _, _ in up)


def test_each_room_imports_only_rooms_below_it():
    upward = [e for e in _graph() if ORDER.index(e[4]) > ORDER.index(e[3])]
    bad = [f"{f}:{n} imports {m} ({a} -> {b})" for f, n, m, a, b in upward]
    assert not bad, "imports upward (docs/architecture.md's layering):\n" + "\n".join(bad)


def test_the_tree_is_the_import_path():
    """``mentor.X.Y`` is the file X/Y.py (or the package X/Y/): every mentor module imported in the tree resolves
    to the file of that path under the repository."""
    seen = {m for room in ORDER for f in (REPO / room).rglob("*.py") for _, m in _imports(f)
            if m.startswith("mentor.") and m.split(".")[1] in ORDER}
    wrong = []
    for mod in sorted(seen):
        spec = importlib.util.find_spec(mod)
        rel = Path(*mod.split(".")[1:])
        expected = {REPO / rel.with_suffix(".py"), REPO / rel / "__init__.py"}
        if spec is None or spec.origin is None or Path(spec.origin).resolve() not in expected:
            wrong.append(f"{mod} -> {spec.origin if spec else None}")
    assert not wrong, "\n".join(wrong)


def test_the_live_hints_entry_the_launchers_name_exists():
    """training/ starts the hint stage's live-hints entry by name, never by import: the name is the file it says, a
    process module; each trainer's live hook is a module of its own folder that the entry hands the hint call."""
    from mentor.training.launcher import get_launcher, trainer_kinds
    from mentor.training.live_hints import LIVE_ENTRY, live_entry_file
    from mentor.training.openrlhf.launcher import LIVE_FILE
    from mentor.training.trl.launcher import LIVE_MODULE

    path = REPO / Path(*LIVE_ENTRY.split(".")[1:]).with_suffix(".py")
    assert LIVE_MODULE == LIVE_ENTRY and live_entry_file() == LIVE_FILE == path and path.is_file()
    assert 'if __name__ == "__main__":' in path.read_text() and "def __getattr__(name: str)" in path.read_text()
    hooks = {k: get_launcher(k).live for k in trainer_kinds() if get_launcher(k).live}
    assert hooks == {"openrlhf": "mentor.training.openrlhf.live", "trl": "mentor.training.trl.live"}
    for kind, hook in hooks.items():
        file = REPO / Path(*hook.split(".")[1:]).with_suffix(".py")
        assert file.parent == REPO / "training" / kind and file.is_file()
    assert "def main(argv: list[str], hinter: HinterFactory)" in (REPO / "training" / "trl" / "live.py").read_text()
    assert 'FILE_EXPORTS = {"AgentExecutor": agent_executor}' in (REPO / "training" / "openrlhf" / "live.py").read_text()
