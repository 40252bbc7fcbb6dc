"""verl reward function: set ``reward.custom_reward_function.path`` to this file
(``reward.custom_reward_function.name=compute_score``, the default name).

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)``
per response, where `solution_str` is the response only, `ground_truth` is
``reward_model.ground_truth`` of the prompt row (`mentor build` writes the
domain-form reference: the math answer, or the code tests JSON) and
`extra_info` is the row's ``extra_info`` (``problem_id``, ``hint_id``,
``round``, ``index``). It returns a float in [0, 1] and never raises.

Every rollout is logged like the OpenRLHF reward file does (same records,
``trainer: "verl"``), because verl's own ``trainer.rollout_data_dir`` dump
misses groups that DAPO's dynamic sampling filtered out. verl does not pass the
prompt to reward functions, so records carry ``prompt: ""``; nor the response's length, so
``truncated`` (the response hit ``data.max_response_length``) is counted with the policy's
tokenizer against the limit the launcher set (``MENTOR_RESPONSE_LIMIT``,
``MENTOR_POLICY_TOKENIZER``; `reward_core.counted_truncation`); `mentor ingest
--format openrlhf DIR --problems PROBLEMS` fills the problem text by id.

verl calls this in its ``TaskRunner`` actor, in ``compute_reward_async`` tasks or in
``RewardLoopWorker`` actors on every node: ``MENTOR_ROLLOUT_DIR`` must reach them through
the Ray job's runtime env (`mentor.training.rollout_log.ray_job_config_env`; verl's own
``ray.init`` merges it), not only the launcher's environment.
"""

from __future__ import annotations

import json
import logging
import sys

log = logging.getLogger("mentor.training.verl.reward")

try:
    # module level, in a try: where the trainer's Python lacks mentor, the load fails below naming the fix
    from mentor.pipeline.ids import text_id
    from mentor.training.reward_core import Target, counted_truncation, score_and_log  # likewise
except Exception as exc:  # fail at load, loudly: without mentor every score would be 0
    raise ImportError(f"{__file__}: mentor is not importable in the trainer's Python ({sys.version.split()[0]}, "
                      f"{sys.executable}): {type(exc).__name__}: {exc}; install it there: pip install 'mentor[reward]' "
                      "(Python >= 3.10)") from exc


def _domain(ground_truth) -> tuple[str, str | dict]:
    if isinstance(ground_truth, dict):
        return ("code", ground_truth) if "tests" in ground_truth else ("math", str(ground_truth.get("answer")))
    text = str(ground_truth)
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "tests" in obj:
            return "code", obj
        if isinstance(obj, dict) and "answer" in obj:  # a full mentor prompt label
            return obj.get("domain", "math"), str(obj["answer"])
    return "math", text


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Correctness of `solution_str` in [0, 1]; 0.0 on any internal error (logged)."""
    try:
        info = extra_info if isinstance(extra_info, dict) else {}
        domain, reference = _domain(ground_truth)
        if isinstance(info.get("ability"), str) and info["ability"] in ("math", "code"):
            domain = info["ability"]
        pid = info.get("problem_id") or text_id(f"{data_source}:{ground_truth}")
        label_text = json.dumps(reference, sort_keys=True) if isinstance(reference, dict) else reference
        target = Target(domain, reference, str(pid), info.get("hint_id"), int(info.get("round") or 0), label_text)
        step = kwargs.get("step") if isinstance(kwargs.get("step"), int) else None
        # verl passes the decoded response only: whether it hit data.max_response_length is counted (reward_core)
        truncated = counted_truncation(solution_str or "")
        return float(score_and_log(target, solution_str or "", "", "verl", truncated=truncated, step=step, beside=__file__))
    except Exception:
        log.exception("mentor compute_score failed; score 0")
        return 0.0


__all__ = ["compute_score"]
