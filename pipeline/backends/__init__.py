"""The LLM backends, one module per kind: ``backends/<name>.py`` declares ``BACKEND``, a `BackendKind`.

A kind owns everything mentor knows about it: its name (the file's), what its settings may hold
(`problem`, `check`: what loading a workflow refuses, naming the setting), how one is built
(`make`), what the command line gives it (`from_flags`), what ``mentor doctor`` checks for it
(`node_checks`: its rows about this node; `unavailable`, `probe`, `schema_fix`: its one-request
check), and whether it starts an engine in this process (`engine`) or talks to a server at
``base_url`` (`server`). Every list of kinds (the ``--backend`` choices, the settings'
check, `mentor.pipeline.llm.make_backend`) comes from `kinds()`: a new backend is one new file
here, or ``backends/<name>.py`` in a folder of ``MENTOR_PLUGIN_PATH`` (`mentor.pipeline.plugins`).

A kind may be a package whose other modules are its parts: `vllm.engine` is the only module that
imports vLLM, `openai.client` the only one that talks to a server.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError

DEFAULT = "vllm"  # the kind of a setting or a command that names none (the one place it is named outside its file)
REQUEST_TIMEOUT = 600.0  # seconds a server backend's request may wait by default (a long generation on a busy server fits)


@dataclass(frozen=True)
class DoctorNode:
    """What ``mentor doctor`` knows when it asks a kind for its checks of this node: its flags (``--role``:
    hint | trainer | all, ``--model``, ``--base-url``, ``--tensor-parallel-size``, ``--gpu-memory-utilization``)
    and the GPUs a CUDA process here sees (each with ``index``, ``name``, ``total_mib``, ``used_mib``)."""

    role: str = "all"
    model: str | None = None
    base_url: str | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    gpus: list[Any] = field(default_factory=list)


Check = Callable[[], "tuple[str, str, str | None]"]  # a doctor row: (ok | problem | skip, detail, fix or None)


class BackendKind:
    """What one kind of backend declares; a kind's module sets ``BACKEND = <its subclass>()``.

    The defaults fit a backend that needs nothing (no model, no options, no server): a toy
    overrides `make` and sets `name`, `what` and `help`.
    """

    name = ""  # the kind, as settings and --backend name it (its module's name)
    what = ""  # a few words for lists of choices: "an engine here"
    help = ""  # one sentence for --backend's help
    engine = False  # starts an engine in this process (one per dask worker; stopped when the stage ends)
    server = False  # talks to a server at base_url; its model is the name the server serves
    schema_fix: str | None = None  # doctor's fix when its answer is not the JSON a schema asks for
    serves = False  # ``mentor serve`` can start an OpenAI-compatible server of it (`serve_command`)

    def problem(self, model: str | None, base_url: str | None) -> str | None:
        """What the settings lack or hold against this kind by themselves (the settings model refuses it)."""
        if base_url and not self.server:
            return f"base_url is for a server backend ({', '.join(server_kinds())}), not {self.name}"
        return None

    def check(self, model: str | None, options: dict[str, Any], where: str) -> None:
        """Refuse now what `make` would refuse (a workflow at load): ``<where>.options.<name>: ...``."""
        problem = self.problem(model, options.get("base_url"))
        if problem:
            raise ConfigError(f"{where}: {problem}")

    def settle(self, model: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """The options `make` gets (defaults filled in); an engine is kept per model and settled options."""
        return options

    def make(self, model: str | None, options: dict[str, Any]) -> Any:  # pragma: no cover - each kind's own
        """A `mentor.pipeline.llm.Backend` of this kind."""
        raise NotImplementedError

    def from_flags(self, model: str | None, flags: dict[str, Any]) -> dict[str, Any]:
        """The options from a command's flags: ``engine`` (flag -> (option, value or None)), ``base_url``,
        ``max_concurrency``, ``structured_output``, ``request_timeout``, ``script`` (the command's fake answers)."""
        return {}

    def tokenizer(self, model: str | None) -> str | None:
        """The tokenizer its model brings here (renders a policy's prompts), or None (a server's model is a name)."""
        return None

    def gpus(self, options: dict[str, Any]) -> int:
        """GPUs one of its engines takes (a dask worker's share)."""
        return 1

    def node_checks(self, node: DoctorNode) -> dict[str, Check]:
        """``mentor doctor``'s rows about this node for this kind, by name (every kind's, in `kinds()` order, after
        the node's own rows): each a call returning ``(status, detail, fix)``, status ``ok``, ``problem`` (give
        the fix) or ``skip`` (the detail says why it does not apply). One that raises is a problem row."""
        return {}

    def serve_command(self, model: str | None, settings: dict[str, Any]) -> tuple[list[str], dict[str, str]]:  # pragma: no cover
        """``mentor serve``: the command (argv, environment) of an OpenAI-compatible server for `model`, `settings`
        being the command's ``port``, ``host``, ``served_model_name``, ``tensor_parallel_size``, ``max_model_len``,
        ``dtype`` and ``extra_args`` (a kind that `serves` overrides it)."""
        raise NotImplementedError

    def cpu_setup(self, installed: Callable[[str], bool]) -> tuple[list[list[str]], str | None]:
        """``mentor setup-cpu``: the pip arguments (``["uninstall", "-y", ...]``) this kind needs on a CPU machine,
        given what is `installed` (a distribution name -> bool), and a note for the user (or None)."""
        return [], None

    def unavailable(self) -> str | None:
        """Why it cannot run on this node (``mentor doctor``'s engine row is then skipped with it), or None."""
        return None

    def probe(self, model: str | None, base_url: str | None, settings: dict[str, Any]) -> dict[str, Any]:
        """The options of ``mentor doctor``'s one-request check (`settings`: its --timeout, --tensor-parallel-size,
        --gpu-memory-utilization as ``timeout``, ``tensor_parallel_size``, ``gpu_memory_utilization``)."""
        return {"base_url": base_url} if base_url else {}


def installed(dist: str) -> bool:
    """Whether the Python distribution `dist` is installed here (its metadata; nothing is imported)."""
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def kinds() -> list[str]:
    """Every kind, the default first (built-in ones, then plugins), by file name: nothing is imported."""
    return [DEFAULT, *(n for n in plugins.names("backends") if n != DEFAULT)]


def kind(name: Any) -> BackendKind:
    """The kind called `name` (a `ConfigError` naming the kinds when there is none)."""
    if not isinstance(name, str) or name not in kinds():
        raise ConfigError(f"unknown backend {name!r}; choose {choices()}")
    declared = getattr(plugins.load("backends", name), "BACKEND", None)
    if not isinstance(declared, BackendKind):
        raise ConfigError(f"{plugins.module_name('backends', name)}: BACKEND must be a "
                          f"mentor.pipeline.backends.BackendKind, got {declared!r}")
    return declared


def choices() -> str:
    """The kinds in words: ``vllm (an engine here), fake (tests) or openai (a server)``."""
    named = [f"{n} ({kind(n).what})" if kind(n).what else n for n in kinds()]
    return ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else named[0]


def serving_kind() -> BackendKind:
    """The kind ``mentor serve`` starts a server with: the first that `serves` (the default first)."""
    for name in kinds():
        if kind(name).serves:
            return kind(name)
    raise ConfigError(f"no backend kind here serves a model (kinds: {choices()})")


def server_kinds() -> list[str]:
    """The kinds that talk to a server at base_url."""
    return [n for n in kinds() if kind(n).server]


__all__ = ["DEFAULT", "REQUEST_TIMEOUT", "BackendKind", "DoctorNode", "choices", "installed", "kind", "kinds", "server_kinds", "serving_kind"]
