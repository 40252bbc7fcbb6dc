"""The TRL trainer process of one round: ``python -m mentor.training.trl.train <train>/trl_round.json``.

`mentor.training.trl.launcher.run_round` writes the round file and starts this
module with ``MENTOR_ROLLOUT_DIR`` (and, on CPU, ``OMP_NUM_THREADS``) set: as
one process, or as each of the ``num_processes`` processes ``accelerate launch``
starts (torchrun; TRL's trainer then runs data parallel over them, each process
scoring and logging its own share of the completions into its own shard). It
loads the selected prompt rows (`prompt_rows`: a text prompt without the leading BOS its
tokenizer adds itself), builds TRL's ``GRPOConfig`` and ``GRPOTrainer``
with mentor's reward function, trains, saves the final model (every process
takes part, for DeepSpeed/FSDP; the main process writes) into a temporary folder
renamed to ``<train>/model`` once complete, and writes ``<train>/metrics.json``
(TRL's log history).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from mentor.pipeline.io import write_json_atomic
from mentor.pipeline.policy_template import text_for_tokenizer
from mentor.training.reward_core import STATS
from mentor.training.trl.launcher import LIVE_MODULE, TrlTrainConfig, training_rows
from mentor.training.trl.lora import lora_config, save_merged
from mentor.training.trl.processes import die_with_parent
from mentor.training.trl.reward import make_reward


def _threads(n: int | None) -> None:
    if n:
        import torch  # slow to import (trl brings it)

        torch.set_num_threads(int(n))


def prompt_rows(cfg: TrlTrainConfig, tokenizer: Any, pad_rows: int = 0) -> list[dict[str, Any]]:
    """The round's rows as TRL's GRPOTrainer gets them (`training_rows`: whole generation batches, as TRL's sampler
    drops an incomplete one). A text prompt (placement assistant) is tokenized by TRL with
    special tokens (``processing_class(text=prompts)``): it goes without the template's leading BOS where the
    tokenizer adds one itself (Llama-3.x, R1-Distill-Llama), so every row starts with one BOS, as a chat prompt does."""
    rows = training_rows(cfg, pad_rows)
    return [{**r, "prompt": text_for_tokenizer(r["prompt"], tokenizer)} if isinstance(r["prompt"], str) else r for r in rows]


def main(argv: list[str], live: Callable[[TrlTrainConfig, list[dict[str, Any]], Any], tuple[Any, Any]] | None = None) -> int:
    """Train one round. `live`: with ``live_hints``, (config, rows, tokenizer) -> (rollout function, reward), given by
    TRL's live hook (`mentor.training.trl.live`, which the live-hints entry `LIVE_MODULE` runs with the hint call)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1:
        print(f"usage: python -m {LIVE_MODULE + ' trl' if live else 'mentor.training.trl.train'} TRAIN_DIR/trl_round.json",
              file=sys.stderr)
        return 2
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    if os.environ.get("LOCAL_RANK") is not None:  # started by accelerate/torchrun: die with the launcher, as it dies with mentor
        die_with_parent()
    _threads(spec.get("cpu_threads"))

    # slow to import (the trainer's libraries): after the argument checks and the parent-death signal
    from datasets import Dataset
    from transformers import AutoTokenizer  # likewise
    from trl import GRPOConfig, GRPOTrainer  # likewise

    cfg = TrlTrainConfig.model_validate(json.loads((spec_path.parent / "config.json").read_text()))
    if cfg.live_hints is not None and live is None:
        print(f"{spec_path}: the round has live_hints: run it as python -m {LIVE_MODULE} trl (mentor train does)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    rows = prompt_rows(cfg, tokenizer, int(spec.get("pad_rows") or 0))
    dataset = Dataset.from_list(rows)  # columns prompt (chat messages, or text) and label (mentor's JSON label)
    args = GRPOConfig(**spec["grpo"])
    rollout = None
    if cfg.live_hints is not None:  # hint and re-roll collapsed groups inside the step (the hint stage's hooks)
        rollout, reward = live(cfg, rows, tokenizer)
        extra = {"rollout_func": rollout}
    else:
        reward, extra = make_reward(tokenizer, args.max_completion_length), {}
    if cfg.lora is not None:  # adapters instead of the whole policy (trl.lora)
        extra["peft_config"] = lora_config(cfg.lora, str(spec_path.parent / "config.json"))
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tokenizer,
                          **extra)
    logging.getLogger(__name__).info("training on %d prompt row(s) from %s", len(rows), spec["model"])
    trainer.train()

    final = Path(spec["final_model"])
    tmp = final.with_name(f".{final.name}.tmp")
    adapter = spec_path.parent / "adapter"  # with lora: the adapters beside the merged model
    adapter_tmp = adapter.with_name(f".{adapter.name}.tmp")
    main_process = trainer.accelerator.is_main_process
    if main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(adapter_tmp, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    if cfg.lora is None:
        trainer.save_model(str(tmp))  # on every process (DeepSpeed/FSDP gather the weights); the main one writes
    else:
        save_merged(trainer, spec["model"], tokenizer, adapter_tmp, tmp)
    trainer.accelerator.wait_for_everyone()
    if not main_process:
        logging.getLogger(__name__).info("process %d: done; reward stats %s", trainer.accelerator.process_index, dict(STATS))
        return 0
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if cfg.lora is not None:
        shutil.rmtree(adapter, ignore_errors=True)
        os.replace(adapter_tmp, adapter)
    history = trainer.state.log_history
    # The last step's metrics (reward, completion lengths, clipped ratio), not the closing summary.
    last = next((h for h in reversed(history) if "reward" in h), history[-1] if history else None)
    write_json_atomic(
        {"global_step": trainer.state.global_step, "last_log": last, "log_history": history,
         "reward_stats": dict(STATS), "processes": trainer.accelerator.num_processes}
        | ({"live_hints": {"totals": dict(rollout.totals), "steps": rollout.steps}} if rollout is not None else {}),
        spec_path.parent / "metrics.json",
    )
    logging.getLogger(__name__).info("saved the final model to %s; reward stats %s", final, dict(STATS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
