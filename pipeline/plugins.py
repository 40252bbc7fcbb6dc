"""Extension points are folders: each file (or folder) in one declares one thing, found by its name.

mentor's extension points are packages whose members each declare one thing:

| point | package | a member is | it declares |
| --- | --- | --- | --- |
| ``stages`` | `mentor.stages` | a module or package (hint) | ``STAGE`` (other modules are a stage's parts) |
| ``agents`` | `mentor.stages.hint.agents` | a module (its templates beside it) | ``AGENT`` |
| ``rules`` | `mentor.stages.rules` | a module | rules, by `RuleRegistry.add` |
| ``backends`` | `mentor.pipeline.backends` | a module | ``BACKEND`` |
| ``trainers`` | `mentor.training` | a folder with a ``launcher.py`` | ``LAUNCHER`` (in ``launcher.py``) |
| ``commands`` | `mentor.workflows.cli` | a module | ``COMMANDS`` (its click commands' names and help) |

`names(point)` lists the members by file name without importing any (asking for
one stage does not import the engine seam); `declared(point, name, attr)` reads
what a member assigns to a top-level name without importing it (``mentor --help``
lists the commands this way); `load(point, name)` imports one. A central list (the
stage folders, the ``--backend`` choices, the trainers, the commands) is built from
these, never written by hand. A plugin file that does not parse or import is a
`ConfigError` naming the file, the line and the exception, not a traceback.

**Plugins.** A folder named in ``MENTOR_PLUGIN_PATH`` (``os.pathsep``-separated)
adds members: ``<folder>/<point>/<name>.py`` (a trainer: ``<folder>/trainers/<name>/launcher.py``)
joins that point as if it were built in, importable as
``mentor.plugins.<point>.<name>`` in every process that has the variable (dask
workers and spawned engine processes inherit it, so what a plugin declares
pickles). A plugin may not take a built-in name. Files starting with ``_`` are
never members.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pkgutil
import re
import sys
import traceback
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from mentor.pipeline.errors import ConfigError, MentorError

PLUGIN_PATH_ENV = "MENTOR_PLUGIN_PATH"
PLUGIN_PACKAGE = "mentor.plugins"
# point -> (package, the file that marks a member folder; None: members are modules)
POINTS: dict[str, tuple[str, str | None]] = {
    "stages": ("mentor.stages", None),
    "agents": ("mentor.stages.hint.agents", None),
    "rules": ("mentor.stages.rules", None),
    "backends": ("mentor.pipeline.backends", None),
    "trainers": ("mentor.training", "launcher.py"),
    "commands": ("mentor.workflows.cli", None),
}


def _point(point: str) -> tuple[str, str | None]:
    if point not in POINTS:
        raise KeyError(f"no extension point {point!r} (points: {', '.join(POINTS)})")
    return POINTS[point]


def plugin_dirs() -> list[Path]:
    """The folders of ``MENTOR_PLUGIN_PATH`` that exist, in order."""
    return [Path(p) for p in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep) if p and Path(p).is_dir()]


def _members(folder: Path, marker: str | None) -> list[str]:
    if not folder.is_dir():
        return []
    if marker is not None:
        return sorted(d.name for d in folder.iterdir() if d.is_dir() and d.name.isidentifier()
                      and not d.name.startswith("_") and (d / marker).is_file())
    return sorted(i.name for i in pkgutil.iter_modules([str(folder)]) if not i.name.startswith("_"))  # modules, packages


def _builtin_names(point: str) -> list[str]:
    package, marker = _point(point)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted({n for loc in spec.submodule_search_locations for n in _members(Path(loc), marker)})


def _plugin_names(point: str) -> dict[str, Path]:
    """name -> the plugin folder holding it (the first one on the path wins)."""
    _, marker = _point(point)
    found: dict[str, Path] = {}
    for base in plugin_dirs():
        for name in _members(base / point, marker):
            found.setdefault(name, base)
    return found


def names(point: str) -> list[str]:
    """The members of `point`: built-in first (sorted), then plugins (sorted)."""
    builtin = _builtin_names(point)
    plugins = _plugin_names(point)
    clash = sorted(set(builtin) & set(plugins))
    if clash:
        raise ConfigError(f"{PLUGIN_PATH_ENV}: {plugins[clash[0]] / point / clash[0]} takes the built-in {point[:-1]} "
                          f"name {clash[0]!r}; rename the plugin")
    return [*builtin, *sorted(plugins)]


def module_name(point: str, name: str) -> str:
    """The import name of a member (for a trainer: its ``launcher`` module)."""
    package, marker = _point(point)
    if name in _plugin_names(point):
        package = f"{PLUGIN_PACKAGE}.{point}"
    full = f"{package}.{name}"
    return f"{full}.{Path(marker).stem}" if marker else full


def load(point: str, name: str) -> ModuleType:
    """Import the member `name` of `point` (a KeyError naming the members if there is none).

    A plugin that fails to import (a syntax error, a missing module, an exception at import) is a
    `ConfigError` naming its file and line, the point and the exception."""
    known = names(point)
    if name not in known:
        raise KeyError(f"no {point[:-1]} {name!r} ({point}: {', '.join(known)})")
    module = module_name(point, name)
    try:
        return importlib.import_module(module)
    except MentorError:
        raise
    except Exception as exc:
        if name not in _plugin_names(point):
            raise  # a built-in member that fails to import is mentor's bug
        raise _broken(point, name, exc) from exc


def source(point: str, name: str) -> Path | None:
    """The file of member `name` of `point` (a package's ``__init__.py``, a trainer's ``launcher.py``), found
    without importing it (and whatever an earlier plugin path left in ``sys.modules``)."""
    package, marker = _point(point)
    plugin = _plugin_names(point).get(name)
    if plugin is not None:
        folders = [plugin / point]
    else:
        spec = importlib.util.find_spec(package)
        folders = [Path(loc) for loc in (spec.submodule_search_locations or [])] if spec else []
    for folder in folders:
        for path in ((folder / name / marker,) if marker else (folder / f"{name}.py", folder / name / "__init__.py")):
            if path.is_file():
                return path
    return None


def declared(point: str, name: str, attr: str) -> ast.expr | None:
    """The expression member `name` of `point` assigns to the top-level name `attr`, read without importing
    the member (None where it assigns none; the last assignment wins). A plugin that does not parse is a
    `ConfigError` naming its file and line."""
    path = source(point, name)
    if path is None:
        return None
    text = path.read_bytes()
    try:
        if name not in _plugin_names(point):
            if attr.encode() not in text:
                return None  # no statement names it (most of a folder's modules are parts: nothing to parse)
            # mentor's own module: only its top-level statements that assign `attr` are parsed (a whole module cost
            # 2-4 ms, and `mentor mine` read some 30 of them: 3% of its CPU on 2M rows); a plugin is parsed whole, so
            # that one that does not parse is refused before it is imported.
            try:
                tree = _parse(str(path), declaration_text(text, attr.encode()))
            except SyntaxError:  # a statement this cut does not keep whole: the whole module
                tree = _parse(str(path), text)
        else:
            tree = _parse(str(path), text)
    except SyntaxError as exc:
        if name not in _plugin_names(point):
            raise
        raise _broken(point, name, exc) from exc
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            found = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
            found = node.value
    return found


def declaration_text(text: bytes, attr: bytes) -> bytes:
    """The top-level statements of module `text` that start with ``attr =`` or ``attr:``, each to the next line
    at column 0 that does not close a bracket (a dict written over several lines); blank lines keep line numbers."""
    lines, keep, inside = text.split(b"\n"), [], False
    for line in lines:
        if line[:1] not in (b" ", b"\t", b"", b")", b"]", b"}", b"#"):
            inside = re.match(rb"%s\s*[:=]" % re.escape(attr), line) is not None
        keep.append(line if inside else b"")
    return b"\n".join(keep)


@lru_cache(maxsize=256)
def _parse(path: str, text: bytes) -> ast.Module:  # by content: a file rewritten within one mtime tick is new
    return ast.parse(text, path)


def _broken(point: str, name: str, exc: BaseException) -> ConfigError:
    """The one-line error for plugin `name` of `point` that does not parse or import: ``file:line: ...; the fix``."""
    base = _plugin_names(point)[name]
    where = source(point, name) or base / point / name
    line = None
    if isinstance(exc, SyntaxError) and exc.filename:
        where, line = Path(exc.filename), exc.lineno
    else:  # the deepest frame in the plugin's folder: where the import failed
        for frame in traceback.extract_tb(exc.__traceback__):
            if Path(frame.filename).is_relative_to(base):
                where, line = Path(frame.filename), frame.lineno
    what = (exc.msg if isinstance(exc, SyntaxError) else str(exc)).strip().split("\n")[0]
    return ConfigError(f"{where}{f':{line}' if line else ''}: the {point} plugin {name!r} ({PLUGIN_PATH_ENV}) fails to "
                       f"import: {type(exc).__name__}: {what}; fix the file, or remove it or its folder from "
                       f"{PLUGIN_PATH_ENV}")


class _PluginFinder(importlib.abc.MetaPathFinder):
    """Makes ``mentor.plugins.<point>.<name>`` importable from ``MENTOR_PLUGIN_PATH``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PLUGIN_PACKAGE and not fullname.startswith(PLUGIN_PACKAGE + "."):
            return None
        parts = fullname.split(".")[2:]  # after mentor.plugins
        if len(parts) <= 1 and (not parts or parts[0] in POINTS):  # mentor.plugins, mentor.plugins.<point>
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(d / parts[0]) for d in plugin_dirs()] if parts else []
            return spec
        if parts[0] not in POINTS:
            return None
        rel = Path(*parts[1:])
        for base in plugin_dirs():
            folder = base / parts[0] / rel
            if (folder / "__init__.py").is_file() or folder.is_dir():
                init = folder / "__init__.py"
                if init.is_file():
                    return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(folder)])
                spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
                spec.submodule_search_locations = [str(folder)]
                return spec
            file = folder.with_suffix(".py")
            if file.is_file():
                return importlib.util.spec_from_file_location(fullname, file)
        return None


def install_finder() -> None:
    """Install the plugin finder once (mentor's package does it on import)."""
    if not any(isinstance(f, _PluginFinder) for f in sys.meta_path):
        sys.meta_path.append(_PluginFinder())


__all__ = ["PLUGIN_PATH_ENV", "POINTS", "declaration_text", "declared", "install_finder", "load", "module_name", "names", "plugin_dirs", "source"]
