"""TRL reward function: ``GRPOTrainer(reward_funcs=[make_reward(tokenizer, max_completion_length)])``.

TRL 1.16's ``GRPOTrainer._calculate_rewards`` calls each plain reward function once
per generation batch, with keyword arguments only:

- ``prompts``: one per completion (each prompt repeated ``num_generations`` times),
  conversational (a list of ``{role, content}`` messages, as `mentor build` writes
  the ``prompt`` column) or plain text;
- ``completions``: conversational (``[{"role": "assistant", "content": ...}]``) or
  plain text, decoded with special tokens skipped;
- ``completion_ids``: the completion's token ids; TRL keeps the first end-of-sequence
  token in them, so a completion whose last id is not an EOS (or pad) token was cut at
  ``max_completion_length``: that is TRL's own ``mask_truncated_completions`` rule,
  and the one used here for ``truncated``;
- every other dataset column as a list (here ``label``: mentor's JSON label with the
  reference answer or tests, ``problem_id``, ``hint_id`` and ``round``), plus
  ``trainer_state`` (its ``global_step`` is logged as ``step``), ``log_extra`` and
  ``log_metric``.

It returns one float per completion: the raw correctness (1 correct, 0 not), from the
same verifiers as the OpenRLHF and verl reward files (`reward_core.score_and_log`:
math-verify for math, the hardened two-sandbox verifier for code). It never raises:
an internal error gives 0.0 for that completion and a log line. Every rollout is
appended to this process's shard in the rollout directory (``MENTOR_ROLLOUT_DIR``,
or ``mentor_reward.json`` beside this file) as the other reward files write it
(``trainer: "trl"``), so ``mentor ingest --format openrlhf DIR`` reads TRL logs too.

``reward_func`` is a ready instance without a tokenizer: it works the same, but it
logs the prompt as its messages' text (not chat-templated) and, without the EOS ids,
cannot tell a truncated completion (``truncated`` is then left out of the record).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger("mentor.training.trl.reward")

from mentor.training.reward_core import STATS, count, score_and_log, target_from_label

TRAINER = "trl"


def _text(message_or_text: Any) -> str:
    """A completion's text: plain text as is; a conversational completion's assistant content."""
    if isinstance(message_or_text, str):
        return message_or_text
    if isinstance(message_or_text, dict):
        content = message_or_text.get("content")
        return content if isinstance(content, str) else ""
    if isinstance(message_or_text, (list, tuple)):
        return "".join(_text(m) for m in message_or_text if not isinstance(m, dict) or m.get("role", "assistant") == "assistant")
    return "" if message_or_text is None else str(message_or_text)


class TrlReward:
    """mentor's reward for TRL's GRPOTrainer (see the module docstring)."""

    def __init__(self, tokenizer: Any = None, eos_token_ids: Iterable[int] | None = None,
                 max_completion_length: int | None = None, name: str = "mentor_correct") -> None:
        self.tokenizer = tokenizer
        ids = set(eos_token_ids or ())
        if tokenizer is not None:
            for attr in ("eos_token_id", "pad_token_id"):
                value = getattr(tokenizer, attr, None)
                if isinstance(value, int):
                    ids.add(value)
        self.stop_ids = frozenset(ids)
        self.max_completion_length = max_completion_length
        self.__name__ = name  # TRL names the reward's metrics after it (rewards/<name>/mean)
        self._warned_label = False

    # -- per completion

    def prompt_text(self, prompt: Any) -> str:
        """The prompt as the model saw it: chat-templated when a tokenizer is known."""
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, (list, tuple)):
            if self.tokenizer is not None:
                try:
                    return self.tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
                except Exception:  # a template that refuses the messages: fall back to their text
                    count("trl_chat_template_error")
            return "\n\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
        return "" if prompt is None else str(prompt)

    def truncated(self, ids: Sequence[int] | None) -> bool | None:
        """TRL's rule: cut at the limit when the last token is not an EOS/pad token; None when unknown."""
        if ids is None:
            return None
        ids = list(ids)
        if self.stop_ids:
            return bool(ids) and ids[-1] not in self.stop_ids
        if self.max_completion_length:
            return len(ids) >= self.max_completion_length
        return None

    def one(self, prompt: Any, completion: Any, label: Any, ids: Sequence[int] | None, step: int | None) -> float:
        text = self.prompt_text(prompt)
        target = target_from_label(label, text)
        return float(score_and_log(target, _text(completion), text, TRAINER, truncated=self.truncated(ids), step=step, beside=__file__))

    # -- TRL's call

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 completion_ids: Sequence[Sequence[int]] | None = None, label: Sequence[Any] | None = None,
                 trainer_state: Any = None, log_metric: Any = None, **kwargs: Any) -> list[float]:
        """One reward per completion; never raises."""
        try:
            n = len(completions) if completions is not None else 0
        except TypeError:
            log.error("mentor trl reward: completions is a %s, not a list; no rewards", type(completions).__name__)
            return []
        if label is None and not self._warned_label:
            self._warned_label = True
            log.warning("mentor trl reward: no 'label' column reached the reward function; every reward is 0 "
                        "(keep the label column of `mentor build`'s shards in the training dataset)")
        step = getattr(trainer_state, "global_step", None)
        step = step if isinstance(step, int) else None
        rewards: list[float] = []
        truncated = 0
        for i in range(n):
            try:
                ids = completion_ids[i] if completion_ids is not None and i < len(completion_ids) else None
                cut = self.truncated(ids)
                truncated += int(bool(cut))
                prompt = prompts[i] if prompts is not None and i < len(prompts) else ""
                lab = label[i] if label is not None and i < len(label) else None
                rewards.append(self.one(prompt, completions[i], lab, ids, step))
            except Exception:
                log.exception("mentor trl reward failed on completion %d; reward 0", i)
                count("trl_reward_error")
                rewards.append(0.0)
        if callable(log_metric) and n:
            try:
                log_metric("mentor/truncated", truncated / n)
            except Exception:  # a metrics hook must not cost the rewards
                log.debug("log_metric failed", exc_info=True)
        return rewards


def make_reward(tokenizer: Any = None, max_completion_length: int | None = None, eos_token_ids: Iterable[int] | None = None) -> TrlReward:
    """The reward for `GRPOTrainer(reward_funcs=[...])`; pass the trainer's tokenizer (for the prompt text
    and the EOS ids that tell a truncated completion) and `GRPOConfig.max_completion_length`."""
    return TrlReward(tokenizer=tokenizer, eos_token_ids=eos_token_ids, max_completion_length=max_completion_length)


reward_func = TrlReward()

__all__ = ["STATS", "TrlReward", "make_reward", "reward_func"]
