"""The hint agents: one file each in this folder (``<name>.py`` declaring ``AGENT``), their templates beside them.

`AGENTS` (name -> `Agent`, in `mentor.pipeline.plugins` order: built-in by name, then
``MENTOR_PLUGIN_PATH``'s ``agents/<name>.py``) is read from the folder, never written by
hand; so are what the stage derives from it: the state machine's phases and dispatch
(machine.py), the ``max_tokens.<name>`` settings, the on/off switches and
``agent_chat_template_kwargs`` keys (config.py), the template names (prompt_templates.py),
the violations the agents set (`STAGE_VIOLATIONS`) and the fake backend's answers
(`fake_script`). What an agent file declares: `mentor.stages.hint.agent`.

    attribution.py  problem, reference, failed responses -> {keywords, error}       (analysis)
    generation.py   problem, keywords, error -> {hint}                              (generate)
    judgment.py     problem, reference, hint -> {check, correct, score, feedback}   (review)
    repair.py       problem, rejected hint, violations, feedback -> {hint}          (repair)

The fallback templates (``fallback_*.txt``, no agent's) sit here too.
"""

from __future__ import annotations

import json
from typing import Any

from mentor.pipeline import plugins
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import GenRequest
from mentor.stages.hint.agent import ROLES, Agent
from mentor.stages.rules import RuleRegistry

ONE_OF_ROLE = ("generate", "repair")  # the roles exactly one agent takes


def _collect() -> dict[str, Agent]:
    found: dict[str, Agent] = {}
    for name in plugins.names("agents"):
        module = plugins.load("agents", name)
        agent = getattr(module, "AGENT", None)
        where = module.__file__
        if not isinstance(agent, Agent):
            raise ConfigError(f"{where}: an agent file declares AGENT = <an instance of mentor.stages.hint.agent.Agent>")
        if agent.name != name:
            raise ConfigError(f"{where}: AGENT.name is {agent.name!r}; an agent's name is its file's, {name!r}")
        if getattr(agent, "role", None) not in ROLES:
            raise ConfigError(f"{where}: role {getattr(agent, 'role', None)!r}; one of {', '.join(ROLES)}")
        bad = sorted(t for t in agent.templates if not t.startswith(f"{name}_"))
        if bad:
            raise ConfigError(f"{where}: template name(s) {bad} must start with {name + '_'!r}")
        found[name] = agent
    for role in ONE_OF_ROLE:
        have = [a.name for a in found.values() if a.role == role]
        if len(have) != 1:
            raise ConfigError(f"agents: exactly one agent has role {role!r}, found {have or 'none'}")
    return found


AGENTS: dict[str, Agent] = _collect()
# Violations the agents set themselves (control flow, not the rules): name -> the repair agent's message.
STAGE_VIOLATIONS: dict[str, str] = {k: v for a in AGENTS.values() for k, v in a.violations.items()}
RuleRegistry.declare_violations(STAGE_VIOLATIONS)


def by_role(role: str) -> list[Agent]:
    """The agents of `role`, in the order they run."""
    return [a for a in AGENTS.values() if a.role == role]


_FAKE_KEYS = [(a, next(iter(json.loads(a.fake)))) for a in AGENTS.values() if a.fake]
_FAKE_DEFAULT = by_role("generate")[0].fake


def fake_script(req: GenRequest) -> str:
    """The `--backend fake` model: each agent's declared answer (well-formed, answer-free JSON; tests and demos only).

    The request's JSON schema picks the agent: the first whose answer's first key it has; any
    other request (a thinking agent's, without a schema) gets the generate agent's."""
    props = (req.json_schema or {}).get("properties", {})
    for agent, key in _FAKE_KEYS:
        if key in props:
            return agent.fake
    return _FAKE_DEFAULT


def __getattr__(name: str) -> Any:
    """``agents.GENERATION`` (an agent by its upper-case name) and the template names of prompt_templates.py."""
    if name.lower() in AGENTS and name.isupper():
        return AGENTS[name.lower()]
    if name in ("Templates", "TEMPLATE_DIR", "TEMPLATE_VARS", "FALLBACK_TEMPLATES"):
        from mentor.stages.hint import prompt_templates

        return getattr(prompt_templates, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AGENTS", "STAGE_VIOLATIONS", "by_role", "fake_script"]
