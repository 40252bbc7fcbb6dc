"""Live hints in OpenRLHF 0.11.2: an agent executor (``--train.agent_func_path``) that hints and re-rolls collapsed groups.

OpenRLHF's live hook (`OpenRLHFLauncher.live`). OpenRLHF loads the live-hints entry's file by path
(``--train.agent_func_path <stages/hint/live.py>``, `mentor.training.live_hints.live_entry_file`) in every vLLM
engine actor (``openrlhf.trainer.ray.vllm_engine._load_agent_executor``: its ``AgentExecutor`` class, built with
no arguments); with ``MENTOR_LIVE_TRAINER=openrlhf`` the entry finds it in this module's `FILE_EXPORTS`:
`agent_executor` builds it around `LiveExecutor` with the hint call (`mentor.training.live_hints.Hinter`; this
folder never imports the hint stage). For each prompt of a rollout batch OpenRLHF calls
``RolloutRayActor.generate_responses``, which runs ``n_samples_per_prompt`` calls of ``execute(prompt, label, ...)``
concurrently (``asyncio.gather``) in the actor's event loop. One call sees one sample, so a group is never handed
over whole: `LiveExecutor` joins the calls of one gather into a group. Each call registers under its
(prompt, label) before its first ``await``; gather starts all of its calls before any of them resumes, so when the
first resumes every sample of that prompt has joined and the group is sealed (a later call of the same prompt
starts a new group). Each call then generates its own sample through the actor's ``llm_engine.generate`` (as
OpenRLHF's ``SingleTurnAgentExecutor``: the same tokenization, the same prompt cut and dynamic ``max_tokens``) and
scores it with mentor's verifiers; the last call of the group to finish decides for the group:

- a reward above 0 anywhere: every sample is returned as generated (``scored``);
- all 0: the group becomes one COLLAPSED row (its very responses, the problem text of the row's prompt messages,
  found by its label in the round's prompt shards) and goes through the hint call (`Hinter.hint`:
  the hint stage's four agents, rules, judge and fallback) on the hint engine, within the step's budget; the
  hinted prompt is rendered as `mentor build` renders the placement (`render_prompt` with the policy's chat
  template, tokenized without added special tokens: one BOS) and the group is re-rolled from it; the re-rolls
  are returned, so OpenRLHF's experience (``observation_tokens``) and loss use the hinted prompt as the context.

A "step" here is a burst of generation: OpenRLHF's synchronous loop generates a whole rollout batch and then
trains, so the engine is idle between batches. A call that finds the executor idle for at least
``MENTOR_LIVE_STEP_GAP`` seconds (default 1) starts a new step, with a fresh budget. The budget is per vLLM
engine (each engine actor has its own executor): ``max_problems_per_step`` groups per engine and step. With
``--train.async_enable`` generation overlaps training and steps may merge (the budget then bounds the merged burst).

Every rollout is appended to this process's shard of the rollout log (`mentor.training.rollout_log`, as the
offline OpenRLHF reward file does: one line per record, a kill leaves whole lines only) with ``live_status``,
``live_rerolled`` and, for a hinted group, ``live_hint``, ``live_hint_id``, ``live_hint_status``; the first pass
of a hinted group is logged as ``hinted`` (not trained on), the re-rolls as ``rerolled``. Each returned sample's
``extra_logs`` (``mentor_correct``, ``mentor_live_rerolled``, ``mentor_live_hint_seconds``) reach OpenRLHF's
metrics beside its own step time; every step's summary is logged (``live hints step N: ...``) when the engine
goes idle.

Settings from the environment (`mentor train` sets them, through the Ray job's runtime env):
``MENTOR_LIVE_HINTS`` (the round's ``live_hints`` as JSON), ``MENTOR_LIVE_PROMPTS`` (the prompt dataset: parquet
files or folders, comma-separated), ``MENTOR_LIVE_GROUP_SIZE`` (``n_samples_per_prompt``; a group of another size,
e.g. an evaluation pass, is never hinted), ``MENTOR_ROLLOUT_DIR`` and ``MENTOR_RUN_ID``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from copy import deepcopy
from pathlib import Path
from typing import Any

try:  # module level, in a try: loaded (through the entry's file) in the trainer's Python, the load fails naming the fix
    from openrlhf.utils.agent import AgentExecutorBase
    from openrlhf.utils.logging_utils import init_logger

    from mentor.pipeline.errors import ConfigError, EngineError
    from mentor.pipeline.policy_template import render_prompt
    from mentor.training.live_hints import Hinter, HinterFactory, LiveHintsConfig, collapsed_row, live_score, problem_text, with_hint_id
    from mentor.training.reward_core import target_from_label
    from mentor.training.rollout_log import ENV_DIR, make_record, rollout_log
except ImportError as exc:
    raise ImportError(f"{__file__}: mentor or openrlhf is not importable in the trainer's Python ({sys.version.split()[0]}, "
                      f"{sys.executable}): {exc}; install both there: pip install 'mentor[reward]' openrlhf") from exc

log = logging.getLogger(__name__)
if not log.handlers:  # nothing configures logging in an engine actor: OpenRLHF's own handler (INFO, to the trainer's log)
    log = init_logger(log.name)

ENV_LIVE = "MENTOR_LIVE_HINTS"
ENV_PROMPTS = "MENTOR_LIVE_PROMPTS"
ENV_GROUP = "MENTOR_LIVE_GROUP_SIZE"
ENV_GAP = "MENTOR_LIVE_STEP_GAP"
ENV_TEMPERATURE = "MENTOR_LIVE_TEMPERATURE"
TRAINER = "openrlhf"


# --------------------------------------------------------------------------- the round's settings


def load_settings(env: dict[str, str] | os._Environ = os.environ) -> tuple[LiveHintsConfig, dict[str, Any], int | None]:
    """(the live settings, label -> prompt messages of the round's shards, the group size) from the environment."""
    raw = env.get(ENV_LIVE)
    if not raw:
        raise ConfigError(f"{__file__}: {ENV_LIVE} is not set; this agent executor is launched by `mentor train` for a round "
                          "with live_hints (or set it to the round's live_hints as JSON)")
    try:
        cfg = LiveHintsConfig.model_validate(json.loads(raw))
    except ValueError as exc:
        raise ConfigError(f"{ENV_LIVE}: not the live_hints settings as JSON: {exc}") from None
    spec = env.get(ENV_PROMPTS)
    if not spec:
        raise ConfigError(f"{ENV_PROMPTS} is not set: the executor needs the round's prompt shards (comma-separated parquet "
                          "files or folders) to find a collapsed group's problem")
    group = env.get(ENV_GROUP)
    try:
        size = int(group) if group else None
    except ValueError:
        raise ConfigError(f"{ENV_GROUP}={group!r}: give n_samples_per_prompt, a whole number") from None
    return cfg, prompt_index(spec), size


def prompt_index(spec: str) -> dict[str, Any]:
    """label -> prompt of every row of the prompt shards in `spec` (the label is what OpenRLHF hands the executor)."""
    import polars as pl

    files: list[Path] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        path = Path(part)
        found = sorted(path.rglob("*.parquet")) if path.is_dir() else [path] if path.suffix == ".parquet" and path.is_file() else []
        if not found:
            raise ConfigError(f"{ENV_PROMPTS}: {part}: no parquet prompt shards there (live hints read the round's prompts by "
                              "path; give the folder `mentor build` wrote)")
        files += found
    out: dict[str, Any] = {}
    for f in files:
        for row in pl.read_parquet(f, columns=["prompt", "label"]).iter_rows(named=True):
            out.setdefault(row["label"], row["prompt"])
    return out


# --------------------------------------------------------------------------- groups and steps


class Group:
    """The samples of one ``generate_responses`` call (one prompt), joined before their first await.

    (Plain classes, no dataclasses: OpenRLHF executes this file as a module it does not register, where
    `dataclasses` cannot resolve the postponed annotations.)"""

    def __init__(self, prompt: str, label: Any, key: tuple[str, str], done: asyncio.Future) -> None:
        self.prompt, self.label, self.key, self.done = prompt, label, key, done
        self.size = 0
        self.finished = 0
        self.sealed = False
        self.results: dict[int, dict[str, Any]] = {}
        self.error: BaseException | None = None
        self.temperature: float | None = None


class Step:
    """One burst of generation: its budget and its counters."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.hinted = 0
        self.hint_seconds = 0.0
        self.reroll_seconds = 0.0
        self.counts: Counter = Counter()
        self.hinted_groups: dict[str, str] = {}

    def reserve(self, cfg: LiveHintsConfig) -> bool:
        if cfg.max_problems_per_step is not None and self.hinted >= cfg.max_problems_per_step:
            return False
        if cfg.max_seconds_per_step is not None and self.hint_seconds >= cfg.max_seconds_per_step:
            return False
        self.hinted += 1
        return True

    def summary(self) -> dict[str, Any]:
        c = self.counts
        return {"step": self.index, "groups": c["groups"], "collapsed": c["groups"] - c["scored"], "hinted": c["hinted"],
                "rescued": c["rescued"], "over_budget": c["collapsed_over_budget"], "offline_hint": c["collapsed_offline_hint"],
                "no_problem": c["collapsed_no_problem"], "no_room": c["collapsed_no_room"], "hint_failed": c["collapsed_hint_failed"],
                "evaluation": c["collapsed_eval"], "hint_seconds": round(self.hint_seconds, 3),
                "reroll_seconds": round(self.reroll_seconds, 3), "statuses": dict(self.hinted_groups)}


# --------------------------------------------------------------------------- the executor


class LiveExecutor(AgentExecutorBase):
    """OpenRLHF's ``--train.agent_func_path`` executor with live hints (see the module docstring); `hinter` makes the
    hint call from the round's settings."""

    def __init__(self, hinter: HinterFactory, cfg: LiveHintsConfig | None = None, prompts: dict[str, Any] | None = None,
                 group_size: int | None = None, rollout_dir: str | os.PathLike | None = None, backend: Any = None,
                 step_gap: float | None = None) -> None:
        if cfg is None:  # OpenRLHF builds it with no arguments: the round's settings come from the environment
            cfg, prompts, group_size = load_settings()
        self.cfg = cfg
        self.prompts = prompts or {}
        self.group_size = group_size
        rollout_dir = rollout_dir if rollout_dir is not None else os.environ.get(ENV_DIR)
        self.rollout_dir = Path(rollout_dir) if rollout_dir else None
        self._backend = backend
        self._backend_lock = threading.Lock()
        self.step_gap = step_gap if step_gap is not None else float(os.environ.get(ENV_GAP) or 1.0)
        temperature = os.environ.get(ENV_TEMPERATURE)
        self.temperature = float(temperature) if temperature else None  # the training rollouts' (evaluation: another)
        self.hinter: Hinter = hinter(cfg)  # its solutions read once, at the engine's start: a missing file fails the start
        self.open: dict[tuple[str, str], Group] = {}
        self.inflight = 0
        self.idle_since = 0.0
        self.step: Step | None = None
        self.steps: list[dict[str, Any]] = []  # every step's summary (tests; the log line)

    @property
    def backend(self) -> Any:
        """The hint engine, built on first use (in a worker thread: a server is contacted); once per executor."""
        with self._backend_lock:
            if self._backend is None:
                self._backend = self.cfg.backend.spec()()
            return self._backend

    def _hint_one(self, row: dict[str, Any]) -> Any:
        return self.hinter.hint({0: row}, self.backend)

    # -- OpenRLHF's call: one sample

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        if images:
            raise ValueError("live hints: image prompts are not supported (a hinted prompt would lose the image tokens)")
        self._enter()
        try:
            group = self._join(prompt, label)
            group.temperature = getattr(sampling_params, "temperature", None)
            index = group.size - 1
            await asyncio.sleep(0)  # gather started every sample of this prompt before any of them resumes
            group.sealed = True
            if self.open.get(group.key) is group:
                del self.open[group.key]
            try:
                group.results[index] = await self._sample(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)
            except BaseException as exc:  # the group cannot be decided: every sample of it fails with this error
                group.error = group.error or exc
            group.finished += 1
            if group.finished == group.size:  # the last sample of the group to finish decides for all of them
                if group.error is not None:
                    group.done.set_exception(group.error)
                else:
                    try:
                        group.done.set_result(await self._decide(group, sampling_params, max_length, hf_tokenizer, llm_engine))
                    except BaseException as exc:
                        group.done.set_exception(exc)
            return (await group.done)[index]
        finally:
            self._leave()

    def _join(self, prompt: str, label: Any) -> Group:
        key = (prompt, json.dumps(label, default=str))
        group = self.open.get(key)
        if group is None or group.sealed:
            group = Group(prompt, label, key, done=asyncio.get_running_loop().create_future())
            self.open[key] = group
        group.size += 1
        return group

    def _enter(self) -> None:
        now = time.monotonic()
        if self.step is None or (self.inflight == 0 and now - self.idle_since >= self.step_gap):
            self.step = Step(index=0 if self.step is None else self.step.index + 1)
            self.steps.append(self.step.summary())
        self.inflight += 1

    def _leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle_since = time.monotonic()
            s = self.steps[-1] = self.step.summary()
            log.info("live hints step %d: %d group(s), %d collapsed, %d hinted and re-rolled (%d earned reward), %d over budget, "
                     "%d with an offline hint, %d without a problem text, %d without room, %d hint engine failure(s), %d in evaluation; "
                     "hint engine %.1f s, re-roll %.1f s; hinted: %s", s["step"], s["groups"], s["collapsed"], s["hinted"],
                     s["rescued"], s["over_budget"], s["offline_hint"], s["no_problem"], s["no_room"], s["hint_failed"], s["evaluation"],
                     s["hint_seconds"], s["reroll_seconds"], ", ".join(f"{p} ({st})" for p, st in s["statuses"].items()) or "-")

    # -- one sample, as SingleTurnAgentExecutor generates it

    async def _sample(self, prompt: str, label: Any, sampling_params, max_length: int, hf_tokenizer, llm_engine,
                      ids: list[int] | None = None, problem: str | None = None) -> dict[str, Any]:
        ids = ids if ids is not None else hf_tokenizer(text=prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0].tolist()
        params = sampling_params
        if sampling_params.max_tokens is None:
            params = deepcopy(sampling_params)
            params.max_tokens = max(1, max_length - len(ids))
        room = max_length - params.max_tokens
        if len(ids) > room:
            log.warning("prompt length (%d) exceeds max_length (%d) - max_tokens (%d): its first tokens are cut, as OpenRLHF does",
                        len(ids), max_length, params.max_tokens)
            ids = ids[-room:]
        out = (await llm_engine.generate(ids, deepcopy(params), multi_modal_data=None)).outputs[0]
        action = list(out.token_ids)
        logprobs = None
        if sampling_params.logprobs is not None and out.logprobs is not None:
            logprobs = [0.0] * len(ids)
            for tok, lp in zip(action, out.logprobs):
                got = lp.get(tok)
                logprobs.append(got.logprob if got is not None else 0.0)
        response = hf_tokenizer.decode(action, skip_special_tokens=True)
        truncated = out.finish_reason == "length"
        reward = await asyncio.to_thread(live_score, label, prompt, response)
        return {"prompt": prompt, "label": label, "images": None, "mm_train_inputs": None,
                "observation_tokens": ids + action, "action_ranges": [(len(ids), len(ids) + len(action))],
                "rollout_log_probs": logprobs, "truncated": truncated, "reward": reward, "scores": min(1.0, max(0.0, reward)),
                "extra_logs": {"mentor_correct": reward, "mentor_live_rerolled": 0.0, "mentor_live_hint_seconds": 0.0},
                "response": response, "problem": problem}

    # -- the group

    async def _decide(self, group: Group, sampling_params, max_length: int, hf_tokenizer, llm_engine) -> list[dict[str, Any]]:
        step = self.step
        first = [group.results[i] for i in range(group.size)]
        step.counts["groups"] += 1
        status, hint, rerolls, row = self._status(group, first), None, None, None
        if status == "hint":
            target = target_from_label(group.label, group.prompt)
            problem = problem_text(self.prompts[group.label], target.domain, self.cfg.instructions)
            row = collapsed_row(target.problem_id, target.round, target.domain, problem, target.label_text,
                                [s["response"] for s in first])
            status, hint = await self._hint(step, row)
        if hint is not None:
            messages = self.hinter.messages(row["problem"], hint["hint"], row["domain"], self.prompts[group.label])
            text = render_prompt(hf_tokenizer, messages)
            ids = list(hf_tokenizer(text, add_special_tokens=False)["input_ids"])
            need = sampling_params.max_tokens if sampling_params.max_tokens is not None else 1
            if len(ids) + need > max_length:  # never cut a hinted prompt: the group keeps its rollouts
                status = "collapsed_no_room"
            else:
                label = with_hint_id(group.label, hint["hint_id"])
                t0 = time.perf_counter()
                rerolls = await asyncio.gather(*(self._sample(text, label, sampling_params, max_length, hf_tokenizer, llm_engine,
                                                              ids=ids, problem=row["problem"]) for _ in first))
                step.reroll_seconds += time.perf_counter() - t0
                step.counts["hinted"] += 1
                step.counts["rescued"] += int(any(s["reward"] > 0 for s in rerolls))
                step.hinted_groups[row["problem_id"]] = hint["status"]
        if rerolls is None:
            step.counts[status] += 1
        self._log(first, "hinted" if rerolls is not None else status, hint if rerolls is not None else None, False)
        if rerolls is None:
            return [self._returned(s) for s in first]
        self._log(rerolls, "rerolled", hint, True)
        seconds = step.hint_seconds
        return [self._returned(s, rerolled=True, hint_seconds=seconds) for s in rerolls]

    def _status(self, group: Group, first: list[dict[str, Any]]) -> str:
        if any(s["reward"] > 0 for s in first):
            return "scored"
        target = target_from_label(group.label, group.prompt)
        other_size = self.group_size is not None and group.size != self.group_size
        other_temperature = (self.temperature is not None and group.temperature is not None
                             and abs(group.temperature - self.temperature) > 1e-9)
        if other_size or other_temperature:  # not a training group: an evaluation pass (--eval.*) is never hinted
            return "collapsed_eval"
        if target.hint_id and not self.cfg.hint_prompts_with_hints:
            return "collapsed_offline_hint"
        messages = self.prompts.get(group.label)
        if messages is None or problem_text(messages, target.domain, self.cfg.instructions) is None:
            return "collapsed_no_problem"
        return "hint"

    async def _hint(self, step: Step, row: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        if not step.reserve(self.cfg):
            return "collapsed_over_budget", None
        t0 = time.perf_counter()
        try:  # in a worker thread: the actor's event loop goes on serving the other groups
            found = await asyncio.to_thread(self._hint_one, row)
        except EngineError as exc:
            log.error("live hints step %d: the hint engine answered nothing for %s (%s); the group goes on unhinted",
                      step.index, row["problem_id"], exc)
            return "collapsed_hint_failed", None
        finally:
            step.hint_seconds += time.perf_counter() - t0
        hint = found.hints.get(0)
        return ("hinted", hint) if hint is not None else ("collapsed_over_budget", None)

    def _returned(self, s: dict[str, Any], rerolled: bool = False, hint_seconds: float = 0.0) -> dict[str, Any]:
        out = {k: v for k, v in s.items() if k not in ("response", "problem")}
        if rerolled:
            out["extra_logs"] = dict(out["extra_logs"], mentor_live_rerolled=1.0, mentor_live_hint_seconds=hint_seconds)
        return out

    def _log(self, samples: list[dict[str, Any]], status: str, hint: dict[str, Any] | None, rerolled: bool) -> None:
        if self.rollout_dir is None:
            return
        shard = rollout_log(self.rollout_dir, TRAINER)
        for s in samples:
            target = target_from_label(s["label"], s["prompt"])
            rec = make_record(problem_id=target.problem_id, round_=target.round, domain=target.domain, prompt=s["prompt"],
                              response=s["response"], correct=s["reward"], reward=s["reward"], hint_id=target.hint_id,
                              label=target.label_text, truncated=s["truncated"], step=self.step.index, trainer=TRAINER)
            if s["problem"] is not None:
                rec["problem"] = s["problem"]  # the problem without the hint, for mine
            rec |= {"live_status": status, "live_rerolled": rerolled}
            if hint is not None:
                rec |= {"live_hint": hint["hint"], "live_hint_id": hint["hint_id"], "live_hint_status": hint["status"]}
            shard.write(rec)


def agent_executor(hinter: HinterFactory) -> type[LiveExecutor]:
    """OpenRLHF's ``AgentExecutor`` (a subclass of its `AgentExecutorBase`, built with no arguments) with the hint call."""

    class AgentExecutor(LiveExecutor):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(hinter, **kwargs)

    return AgentExecutor


# What OpenRLHF takes by name from the live-hints entry's file it loads by path (``--train.agent_func_path``).
FILE_EXPORTS = {"AgentExecutor": agent_executor}


__all__ = ["FILE_EXPORTS", "LiveExecutor", "agent_executor", "load_settings", "prompt_index", "with_hint_id"]
