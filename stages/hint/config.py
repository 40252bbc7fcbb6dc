"""Settings of the hint stage (`mentor hint`, a workflow's ``hint:`` section): `HintConfig` and `load_config`,
with the judge check's (`JudgeCheckConfig`) and vouching's (`VouchConfig`) sections.

`mentor.stages.hint` is the stage; its ``STAGE.Config`` is `HintConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from mentor.pipeline.errors import config_error
from mentor.pipeline.llm import BackendSettings
from mentor.pipeline.prompts import INSTRUCTIONS
from mentor.pipeline.yaml_io import read_yaml_mapping
from mentor.stages.build_render import DEFAULT_PLACEMENT, PLACEMENTS, TEXT_PLACEMENTS
from mentor.stages.hint.agents import AGENTS
from mentor.stages.rules import RuleLimits


# Qwen3's switch; templates that have no such variable ignore it.
THINKING_OFF = {"enable_thinking": False}


class DomainOverrides(BaseModel):
    """Per-domain settings that replace the global ones when set."""

    model_config = ConfigDict(extra="forbid")

    max_retry: int | None = Field(None, ge=0, description="Regenerations from the keywords after the refines are spent.")
    max_refine: int | None = Field(None, ge=0, description="Repair rounds per generated hint.")
    judge_threshold: float | None = Field(None, ge=1, le=10, description="Minimum judge score (1-10) to accept.")
    max_hint_chars: int | None = Field(None, ge=40, description="Longest acceptable hint, characters.")
    max_hint_sentences: int | None = Field(None, ge=1, description="Most sentences in a hint.")


class JudgeCheckConfig(BaseModel):
    """Settings of the judge check (the ``judge_check:`` section of HintConfig)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Check the LLM judge on a calibration set before the run trusts it "
                          "(only when llm_judge is on).")
    problems: int = Field(8, ge=1, le=1000, description="Collapsed problems (with a reference solution) the calibration "
                          "set is built from: one good and up to three bad hints each, one engine call in all.")
    min_balanced_accuracy: float = Field(0.75, ge=0.0, le=1.0, description="The judge is trusted when its balanced "
                                         "accuracy (mean of the good-accepted and bad-rejected rates) reaches this; "
                                         "0.5 is a coin flip.")
    on_fail: Literal["rules_only", "keep_judge", "error"] = Field(
        "rules_only", description="When the judge cannot tell good from bad: rules_only judges this run by the rules alone "
        "(llm_judge off); keep_judge warns and keeps it; error stops the run.")
    solutions: str | None = Field(None, description="Parquet or JSONL with problem_id and solution (reference solutions "
                                  "for the known-good hints); default: hint.solutions, else the bundled GSM8K, MATH-500 and HumanEval solutions.")


class VouchConfig(BaseModel):
    """Settings of policy vouching (the ``vouch:`` section of HintConfig)."""

    model_config = ConfigDict(extra="forbid")

    policy: BackendSettings = Field(default_factory=BackendSettings, description="The policy that re-rolls each candidate "
                                   "(a backend as `mentor rollout --policy` takes it).")
    samples: int = Field(4, ge=1, le=256, description="Re-rolls per candidate hint (m).")
    candidates: int = Field(3, ge=1, le=20, description="Candidate hints tried per problem (N).")
    pick: Literal["first", "best"] = Field("first", description="first: keep the first candidate that earns reward; "
                                           "best: try all N, keep the one with the most correct re-rolls.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of the re-rolls (the round's).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of the re-rolls.")
    max_tokens: int = Field(1024, ge=1, description="Max new tokens per re-roll (the round's).")
    seed: int = Field(0, description="Base seed of the re-rolls; salted apart from rollout/rescue seeds.")
    avoid_seeds: list[int] = Field(default_factory=lambda: [0], description="Base seeds of the evaluations (mentor rescue "
                                   "--seed) whose per-problem seeds the re-rolls must never reuse.")
    placement: Literal[PLACEMENTS] | None = Field(  # type: ignore[valid-type]
        None, description="Where the hint goes in the re-roll prompt, as `mentor build --placement` (default: assistant "
        f"where the policy's tokenizer is known, i.e. a vllm policy or tokenizer, and the problems are not code tasks; "
        f"else {DEFAULT_PLACEMENT}).")
    tokenizer: str | None = Field(None, description="Tokenizer whose chat template renders placement assistant "
                                  "(default: the vllm policy's own).")
    answer_template: str | None = Field(None, description="How the hint opens the answer (placement assistant), as build's.")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Variables for the policy's chat "
                                                 "template, as build's (e.g. {enable_thinking: false}); {}: its defaults.")
    system_prompt: str | None = Field(None, description="The system message build adds (build's system_prompt).")
    instructions: dict[str, str] = Field(default_factory=lambda: dict(INSTRUCTIONS), description="Per-domain instruction, as build's.")

    @model_validator(mode="after")
    def _answer_template_applies(self) -> "VouchConfig":
        if self.answer_template is not None and self.placement is not None and self.placement not in TEXT_PLACEMENTS:
            raise ValueError(f"answer_template applies to placement assistant (the hint opens the answer), but placement "
                             f"is {self.placement}; set placement: assistant or drop answer_template")
        return self


# max_tokens per agent call (JSON output is also bounded by its schema): one field per agent, from its record.
TokenLimits = create_model(
    "TokenLimits",
    __config__=ConfigDict(extra="forbid"),
    __doc__="max_tokens per agent call (JSON output is also bounded by its schema).",
    **{a.name: (int, Field(a.max_tokens_default, ge=16, description=a.max_tokens_help)) for a in AGENTS.values()},
    thinking=(int, Field(4096, ge=0, description="Added to the max_tokens of an agent whose chat template variables turn "
                         "thinking on (enable_thinking: true): its <think> block comes before its JSON answer.")),
)
AgentName = Literal[tuple(AGENTS)]  # type: ignore[valid-type]
# Each agent's on/off setting (its `Switch`: attribution, generation, llm_judge), from its record.
AgentSwitches = create_model(
    "AgentSwitches",
    __config__=ConfigDict(extra="forbid"),
    __doc__="The agents' on/off settings, one per agent that declares a switch.",
    **{a.switch.key: (bool, Field(a.switch.default, description=a.switch.description))
       for a in AGENTS.values() if a.switch is not None},
)


class HintConfig(AgentSwitches):  # type: ignore[misc,valid-type]
    """Settings of `mentor hint` (also the `hint:` section of a workflow)."""

    model_config = ConfigDict(extra="forbid")

    max_retry: int = Field(2, ge=0, description="Regenerations from the keywords after the refines are spent (the method's Max Retry).")
    max_refine: int = Field(2, ge=0, description="Repair rounds per generated hint (the method's Max Refine).")
    judge_threshold: float = Field(7.0, ge=1, le=10, description="A hint that passes the rules is accepted when the judge's score (1-10) reaches this.")
    judge_correctness: bool = Field(True, description="The judge first states whether every statement and calculation of the hint "
                                    "is correct; a hint judged incorrect is rejected whatever its score.")
    feedback_chars: int = Field(240, ge=16, description="Longest judge feedback, characters.")
    trim_hints: bool = Field(True, description="A hint rejected only for what follows its first sentences (too long, the answer, "
                             "the worked solution) is cut back to its longest leading run of whole sentences that passes the rules, "
                             "and goes on to the judge; off: such a hint goes to repair.")
    reasoning_chars: int = Field(600, ge=0, description="Room for the generation and repair agents to work the problem out "
                                 "(towards the reference answer) before they write the hint; kept in the trace, never in the hint. 0: off.")
    see_solution: bool = Field(True, description="Show every agent the problem's reference solution where there is one "
                               "(the collapsed row's, else `solutions`', else the bundled GSM8K / MATH-500 / HumanEval "
                               "solutions): attribution compares the attempts with it, generation and repair take the "
                               "hint from it (never past its first missing step), judgment checks the hint against it.")
    solutions: str | None = Field(None, description="Parquet or JSONL with problem_id and solution, for rows without a "
                                  "solution (default: the bundled solutions).")
    solution_chars: int = Field(2000, ge=64, description="Characters of the reference solution shown to the agents.")
    max_failed: int = Field(2, ge=0, description="Failed responses shown to the attribution agent.")
    failed_chars: int = Field(1500, ge=64, description="Characters kept per failed response in the prompt (mostly its end).")
    max_keywords: int = Field(5, ge=1, le=20, description="Keywords the attribution agent may return.")
    keyword_chars: int = Field(40, ge=4, description="Longest keyword, characters.")
    error_chars: int = Field(240, ge=16, description="Longest attributed error, characters.")
    domains: dict[Literal["math", "code"], DomainOverrides] = Field(default_factory=dict, description="Per-domain overrides, e.g. {code: {max_refine: 3}}.")
    max_tokens: TokenLimits = Field(default_factory=TokenLimits, description="max_tokens per agent.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature of generation and repair.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of generation and repair.")
    analysis_temperature: float = Field(0.0, ge=0, le=2, description="Temperature of attribution and judgment.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Base seed; each request's seed derives from it, the problem id, the agent and the attempt.")
    max_hint_chars: int = Field(RuleLimits.max_chars, ge=40, description="Longest acceptable hint, characters (also the JSON schema's maxLength).")
    max_hint_sentences: int = Field(RuleLimits.max_sentences, ge=1, description="Most sentences in a hint.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=lambda: dict(THINKING_OFF),
        description="Variables for the hint model's chat template, for every agent. The default turns a thinking model's "
        "thinking off (Qwen3's enable_thinking); a template that does not use a variable ignores it. {}: the template's defaults.")
    agent_chat_template_kwargs: dict[AgentName, dict[str, Any]] = Field(
        default_factory=dict, description="Per-agent additions to chat_template_kwargs, e.g. {judgment: {enable_thinking: true}} "
        "lets the judge think (its <think> block is dropped before the verdict is read).")
    templates_dir: str | None = Field(None, description="Directory whose <name>.txt files replace the bundled prompt templates.")
    shard_size: int = Field(512, ge=1, description="Problems per shard (one shard = one batch of waves; dask runs shards in parallel).")
    judge_check: JudgeCheckConfig = Field(default_factory=JudgeCheckConfig, description="Score the LLM judge on known-good "
                                          "and known-bad hints before the run trusts it (stages/hint/judge_check.py).")
    vouch: VouchConfig | None = Field(None, description="Keep a hint only when the policy, re-rolled with it, earns reward; "
                                      "else try the next candidate (stages/hint/vouch.py). None: off.")

    def for_domain(self, domain: str) -> tuple[int, int, float, RuleLimits]:
        o = self.domains.get(domain)  # type: ignore[call-overload]
        pick = lambda name: getattr(o, name) if o is not None and getattr(o, name) is not None else getattr(self, name)  # noqa: E731
        limits = RuleLimits(max_chars=pick("max_hint_chars"), max_sentences=pick("max_hint_sentences"))
        return pick("max_retry"), pick("max_refine"), pick("judge_threshold"), limits

    def template_kwargs(self, agent: str) -> dict[str, Any] | None:
        """The chat-template variables of `agent`'s requests (None: none)."""
        kw = {**self.chat_template_kwargs, **self.agent_chat_template_kwargs.get(agent, {})}  # type: ignore[call-overload]
        return kw or None

    def thinks(self, agent: str) -> bool:
        """Whether `agent` runs with thinking on (Qwen3's ``enable_thinking: true``): it then gets
        ``max_tokens.thinking`` more tokens and no JSON grammar, which would force ``{`` first and leave
        no room to think (its answer is read after the ``</think>`` block)."""
        kw = self.template_kwargs(agent) or {}
        return kw.get("enable_thinking") is True

    def semantic(self) -> dict[str, Any]:
        """The settings that change outputs (not how the work is split or where templates live).

        The chat-template variables count only when changed from their defaults: the default
        changes no output of a model whose template does not read it, and keeps the keys of runs
        made before the setting existed.
        """
        # judge_check changes outputs only through its verdict, which a checked run folds into llm_judge.
        out = self.model_dump(mode="json", exclude={"shard_size", "templates_dir", "judge_check"})
        if out["chat_template_kwargs"] == THINKING_OFF:
            del out["chat_template_kwargs"]
        if not out["agent_chat_template_kwargs"]:
            del out["agent_chat_template_kwargs"]
        if out["vouch"] is None:
            del out["vouch"]
        elif not out["vouch"]["chat_template_kwargs"]:  # runs from before the setting keep their keys
            del out["vouch"]["chat_template_kwargs"]
        return out


def load_config(path: str | Path | None, **overrides: Any) -> HintConfig:
    """HintConfig from a YAML file (top level, or under a `hint:` key) plus CLI overrides."""
    data: dict[str, Any] = {}
    if path:
        loaded = read_yaml_mapping(path, "hint settings")
        data = loaded.get("hint", loaded) if isinstance(loaded.get("hint"), dict) else loaded
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return HintConfig(**data)
    except ValidationError as exc:
        raise config_error(exc, f"{path}: invalid hint config" if path else "invalid hint config") from exc


__all__ = ["THINKING_OFF", "DomainOverrides", "HintConfig", "JudgeCheckConfig", "TokenLimits", "VouchConfig",
           "load_config"]
