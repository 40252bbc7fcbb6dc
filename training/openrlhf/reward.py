"""OpenRLHF 0.11.2 reward file: pass this file's path as ``--reward.remote_url``.

OpenRLHF loads it by path (``importlib.util.spec_from_file_location``) once per
vLLM engine process and calls ``reward_func(queries, prompts, labels)`` with ONE
sample per call from worker threads (``asyncio.to_thread`` in
``openrlhf.utils.agent.SingleTurnAgentExecutor``):

- ``queries[i]``: the chat-templated prompt + the response, decoded with special tokens kept;
- ``prompts[i]``: the chat-templated prompt;
- ``labels[i]``: the dataset's label column as is: the JSON label `mentor build` writes
  (answer or tests + problem_id + hint_id + round).

It returns ``{"rewards", "scores", "extra_logs"}`` (float tensors; ``scores`` in
[0, 1], used by dynamic filtering) and never raises: an internal error gives
reward 0 and is logged. Loading it is another matter: where mentor cannot be
imported (a trainer image on another Python, mentor not installed) the load
fails at once with one line naming the Python and the fix, so the trainer stops
at start instead of training on rewards that are all 0. Every rollout is appended to this process's shard in the
rollout directory (``MENTOR_ROLLOUT_DIR``, or ``mentor_reward.json`` beside this
file); `mentor ingest --format openrlhf DIR` reads them back. The engine actors run
on any node of the Ray cluster: `mentor train` hands them ``MENTOR_ROLLOUT_DIR``
through the job's runtime env (``RAY_JOB_CONFIG_JSON_ENV_VAR``) and checks before
launch that every node can write there.

Reward = raw correctness (1 correct, 0 not); OpenRLHF's own shaping flags
(``--reward.stop_properly_penalty_coef``, overlong buffer) still apply on top.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("mentor.training.openrlhf.reward")

try:
    # module level, in a try: where the trainer's Python lacks mentor, the load fails below naming the fix
    from mentor.training.reward_core import STATS, score_and_log, split_query, target_from_label
except Exception as exc:  # fail at load, loudly: without mentor every reward would be 0
    raise ImportError(f"{__file__}: mentor is not importable in the trainer's Python ({sys.version.split()[0]}, "
                      f"{sys.executable}): {type(exc).__name__}: {exc}; install it there: pip install 'mentor[reward]' "
                      "(Python >= 3.10)") from exc


def _one(query, prompt, label) -> tuple[float, bool]:
    response, ended = split_query(query if isinstance(query, str) else str(query), prompt if isinstance(prompt, str) else "")
    target = target_from_label(label, prompt if isinstance(prompt, str) else "")
    # OpenRLHF decodes queries with special tokens kept, so a response without the end-of-turn
    # token was cut at the generation limit: truncated.
    reward = score_and_log(target, response, prompt or "", "openrlhf", truncated=not ended, beside=__file__)
    return reward, ended


def reward_func(queries, prompts, labels):
    """Score each (query, prompt, label); never raises."""
    rewards: list[float] = []
    ended: list[float] = []
    errors = 0
    n = len(queries) if isinstance(queries, (list, tuple)) else 0
    for i in range(n):
        try:
            prompt = prompts[i] if i < len(prompts) else ""
            label = labels[i] if i < len(labels) else None
            r, e = _one(queries[i], prompt, label)
        except Exception:
            log.exception("mentor reward_func failed on sample %d; reward 0", i)
            r, e, errors = 0.0, False, errors + 1
        rewards.append(float(r))
        ended.append(1.0 if e else 0.0)
    try:
        import torch  # the trainer's: heavy, and not a mentor dependency

        t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
        return {
            "rewards": t(rewards),
            "scores": t([min(1.0, max(0.0, r)) for r in rewards]),
            "extra_logs": {"mentor_correct": t(rewards), "mentor_ended": t(ended), "mentor_errors": t([float(errors)] * n)},
        }
    except Exception:  # pragma: no cover - torch is always there in a trainer
        log.exception("mentor reward_func: torch unavailable; returning plain lists")
        return {"rewards": rewards, "scores": rewards, "extra_logs": {}}


__all__ = ["STATS", "reward_func"]
