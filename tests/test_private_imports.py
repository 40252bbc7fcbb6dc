"""No module of mentor's rooms, and no test, imports another module's private name (issue 60), checked statically.

A private name starts with ``_`` (not a dunder). Across a module boundary none of these may reach one:
``from mentor.x.y import _name``; ``m._name`` where ``m`` is an imported mentor module (``from mentor.x import y``,
``import mentor.x.y as m``, or the dotted ``mentor.x.y._name``); ``Name._name`` where ``Name`` was imported from a
mentor module (a class's private attribute). A private module (``_engine.py``) is its package's: the modules of
its own folder may import it, no other. What is shared is public (renamed) or moved beside its users; what a test
needs of a module is a unit with a contract, so it is public too (or the test goes through the public API).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("pipeline", "stages", "training", "data", "workflows")
SCANNED = (*ROOMS, "tests")  # the tests hold to it too: a test reaching into a module tests what no caller can use


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_file(root: Path, name: str) -> Path | None:
    """The file of the import name ``mentor.X.Y`` under `root` (the tree is the import path), or None."""
    parts = name.split(".")
    if parts[0] != "mentor" or len(parts) < 2:
        return None
    path = root.joinpath(*parts[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def offenders(root: Path, rooms: tuple[str, ...] = ROOMS) -> list[str]:
    """``file:line: what`` for every private name a module of `rooms` takes from another module."""
    found = []
    for room in rooms:
        for file in sorted((root / room).rglob("*.py")):
            rel = file.relative_to(root)
            tree = ast.parse(file.read_bytes(), str(file))
            modules: dict[str, Path] = {}  # local name -> the mentor module it is bound to
            imported: set[str] = set()  # local names imported from a mentor module (classes, functions, ...)

            def private_module(name: str, line: int) -> None:
                target = _module_file(root, name)
                if any(_private(p) for p in name.split(".")) and target is not None and target.parent != file.parent:
                    found.append(f"{rel}:{line}: imports the private module {name}")

            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mentor."):
                    private_module(node.module, node.lineno)
                    for alias in node.names:
                        local = alias.asname or alias.name
                        sub = _module_file(root, f"{node.module}.{alias.name}")
                        if sub is not None:
                            modules[local] = sub
                            private_module(f"{node.module}.{alias.name}", node.lineno)
                        else:
                            imported.add(local)
                            if _private(alias.name) and _module_file(root, node.module) != file:
                                found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("mentor."):
                            private_module(alias.name, node.lineno)
                            if alias.asname and _module_file(root, alias.name):
                                modules[alias.asname] = _module_file(root, alias.name)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                    continue
                owner = _dotted(node.value)
                if owner is None:
                    continue
                if owner in modules or owner in imported or _module_file(root, owner) not in (None, file):
                    found.append(f"{rel}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name():
    assert offenders(REPO, SCANNED) == []


def _tree(root, files: dict[str, str]) -> None:
    """Write `files` (path under `root` -> text), folders made as needed."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_check_sees_each_way_of_reaching_in(tmp_path):
    """Each pattern is caught; a module's own private names and its folder's private module are not."""
    _tree(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/backends/__init__.py": "",
        "pipeline/backends/_engine.py": "_CACHE = {}\n",
        # its own folder's private module: fine; its private names: not
        "pipeline/backends/vllm.py": "from mentor.pipeline.backends import _engine\n"
                                     "from mentor.pipeline.backends._engine import _CACHE\n_engine._CACHE.clear()\n",
        "pipeline/io.py": "_LOCK = None\n\n\nclass Writer:\n    _open = 0\n\n\ndef f():\n    return _LOCK, Writer._open\n",
        "stages/__init__.py": "",
        "stages/mine.py": "import mentor.pipeline.io as pio\nimport mentor.pipeline.io\nfrom mentor.pipeline import io\n"
                          "from mentor.pipeline.io import _LOCK, Writer\nfrom mentor.pipeline.backends import _engine\n\n"
                          "pio._LOCK, io._LOCK, mentor.pipeline.io._LOCK, Writer._open\n",
    })
    got = offenders(tmp_path, ("pipeline", "stages"))
    assert got == [
        "pipeline/backends/vllm.py:2: from mentor.pipeline.backends._engine import _CACHE",
        "pipeline/backends/vllm.py:3: _engine._CACHE",
        "stages/mine.py:4: from mentor.pipeline.io import _LOCK",
        "stages/mine.py:5: imports the private module mentor.pipeline.backends._engine",
        "stages/mine.py:7: pio._LOCK",
        "stages/mine.py:7: io._LOCK",
        "stages/mine.py:7: mentor.pipeline.io._LOCK",
        "stages/mine.py:7: Writer._open",
    ], got


def test_a_test_is_held_to_it_too(tmp_path):
    """A test module reaching into a module (its private name, or a package's private module) is reported."""
    _tree(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/backends/__init__.py": "",
        "pipeline/backends/_engine.py": "def start():\n    pass\n",
        "pipeline/io.py": "_LOCK = None\n\n\ndef write():\n    pass\n",
        "tests/test_io.py": "from mentor.pipeline import io\nfrom mentor.pipeline.io import _LOCK, write\n"
                            "from mentor.pipeline.backends._engine import start\n\nio._LOCK, write\n",
    })
    assert offenders(tmp_path, ("tests",)) == [
        "tests/test_io.py:2: from mentor.pipeline.io import _LOCK",
        "tests/test_io.py:3: imports the private module mentor.pipeline.backends._engine",
        "tests/test_io.py:5: io._LOCK",
    ]
