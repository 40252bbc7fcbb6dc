"""OpenRLHF's own launch checks on a round's command, run from its installed source without ray or a GPU.

``openrlhf.cli.train_ppo_ray`` imports ray at the top and builds its parser inside
``if __name__ == "__main__"``, so it cannot be imported on a CPU machine; its
statements are read from the installed source and executed as they are
(`check_with_openrlhf`). `openrlhf.placement` then reads the
GPUs a round reserves from the arguments this returns.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.util
import io
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from mentor.pipeline.errors import ConfigError


def _openrlhf_module() -> tuple[str, ast.Module, ast.If]:
    spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    if spec is None or not spec.origin:
        raise ConfigError("openrlhf is not installed; pip install --no-deps openrlhf==0.11.2")
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    main = next((n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)), None)
    if main is None:
        raise ConfigError(f"{spec.origin}: no __main__ block; is this OpenRLHF 0.11.x?")
    return spec.origin, tree, main


class _Missing(types.ModuleType):
    """Stands in for a module the dry run cannot import here (ray, modelscope): every attribute is a no-op."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


def check_with_openrlhf(cmd: list[str]) -> tuple[Any, list[str]]:
    """Run OpenRLHF's own launch checks on `cmd`'s flags; returns (the arguments it would train
    with, the notes it printed). `ConfigError` with OpenRLHF's message when it rejects them.

    The whole ``if __name__ == "__main__"`` block of ``openrlhf.cli.train_ppo_ray`` runs
    (its parser, then every post-parse check and adjustment), with ``train`` replaced by a
    function that keeps the parsed arguments. The module's imports other than the
    standard library's (ray, vLLM, DeepSpeed) are skipped: only ``train`` uses them.
    """
    origin, tree, main = _openrlhf_module()
    ns: dict[str, Any] = {"__name__": "__main__", "__file__": origin, "__builtins__": builtins}
    for stmt in tree.body:
        if stmt is main or (isinstance(stmt, (ast.Import, ast.ImportFrom)) and not _stdlib_import(stmt)):
            continue  # ray, vLLM, DeepSpeed: only train() uses them (and importing vLLM takes half a minute)
        exec(compile(ast.Module(body=[stmt], type_ignores=[]), origin, "exec"), ns)  # noqa: S102 - OpenRLHF's own code
    captured: list[Any] = []
    ns["train"] = captured.append
    real_import = builtins.__import__

    def tolerant_import(name, globals=None, locals=None, fromlist=(), level=0):
        try:
            return real_import(name, globals, locals, fromlist, level)
        except ImportError:
            return _Missing(name)  # e.g. modelscope for --use_ms: not needed to check the flags

    ns["__builtins__"] = dict(vars(builtins), __import__=tolerant_import)
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [origin, *cmd[3:]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(ast.Module(body=main.body, type_ignores=[]), origin, "exec"), ns)  # noqa: S102
    except SystemExit as exc:
        if exc.code not in (0, None) or not captured:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            said = next((ln.split("error:", 1)[1].strip() for ln in reversed(lines) if "error:" in ln), None)
            raise ConfigError(f"OpenRLHF's train_ppo_ray rejects the command: {said or (lines[-1] if lines else exc.code)}") from None
    except AssertionError as exc:
        raise ConfigError(f"OpenRLHF's train_ppo_ray rejects the command: {_assertion_text(exc, origin)}") from None
    except Exception as exc:  # its checks raise other errors too (ValueError from a conversion, ...)
        raise ConfigError(f"OpenRLHF's train_ppo_ray rejects the command: {type(exc).__name__}: {exc}") from None
    finally:
        sys.argv = argv
    if not captured:
        raise ConfigError("OpenRLHF's train_ppo_ray did not reach train() with this command; run it by hand to see why")
    notes = [ln for ln in (out.getvalue() + err.getvalue()).splitlines() if ln.strip()]
    return captured[0], notes


def _stdlib_import(stmt: ast.Import | ast.ImportFrom) -> bool:
    names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
    return not getattr(stmt, "level", 0) and all(n.split(".")[0] in sys.stdlib_module_names for n in names)


def _assertion_text(exc: AssertionError, origin: str) -> str:
    """An assertion's message, or the failing line of OpenRLHF's source when it has none."""
    if str(exc):
        return str(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == origin]
    return f"assertion failed at {origin}:{frames[-1].lineno}: {frames[-1].line}" if frames else "an assertion failed"
