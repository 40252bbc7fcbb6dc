"""verl's side of a round on a CPU machine, for tests: real checkpoints, real argv parsing, real ``ray.init``, real reward loading.

No GPU here, so verl's training loop (its workers, vLLM rollout servers, TransferQueue) cannot run. What can:

- `write_fsdp_checkpoint`: an FSDP checkpoint written by verl's own ``FSDPCheckpointManager`` from a
  model sharded with verl's own ``apply_fsdp2`` over ``world_size`` CPU processes (gloo), in the
  layout verl's trainer saves (``global_step_N/actor/model_world_size_W_rank_R.pt``, ``fsdp_config.json``,
  ``huggingface/``, and ``latest_checkpointed_iteration.txt`` beside the step folders).
- ``python tests/verl_standin.py OVERRIDES...``: stands in for ``python -m verl.trainer.main_ppo
  OVERRIDES...``. It runs verl's own ``main_ppo.main``: its ``@hydra.main`` parses the overrides,
  ``validate_config`` runs, and verl's own ``run_ppo`` starts Ray with ``ray.init`` and the runtime env
  verl builds (its defaults, ``ray_kwargs.ray_init``, merged by Ray with the job config in
  ``RAY_JOB_CONFIG_JSON_ENV_VAR``). Only the TaskRunner actor, which needs GPUs, is replaced: the
  stand-in actor loads the reward function with verl's own ``get_custom_reward_fn``, scores ``n``
  made-up responses (the right answer for even ones, a wrong one for odd) of the first two prompt rows
  with the keyword arguments verl's naive reward manager passes, then writes the checkpoint of
  ``actor_rollout_ref.model.path`` into ``trainer.default_local_dir``. What it saw (its environment
  and the runtime env Ray gave it included) goes to ``<default_local_dir>/standin.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def _rank(rank: int, world: int, port: int, model_dir: str, actor_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import apply_fsdp2

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # verl's FSDP2 engine: apply_fsdp2, then fsdp2_load_full_state_dict, which moves the weights to the GPU;
    # on CPU fully_shard keeps the loaded values, sharded over the mesh.
    apply_fsdp2(model, {"mesh": mesh, "reshard_after_forward": True}, {})
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    manager = FSDPCheckpointManager(model=model, optimizer=optim, lr_scheduler=None,
                                    processing_class=AutoTokenizer.from_pretrained(model_dir))
    manager.save_checkpoint(actor_dir, global_step=int(Path(actor_dir).parent.name.rsplit("_", 1)[1]))
    dist.barrier()
    dist.destroy_process_group()


def write_fsdp_checkpoint(model_dir: str | os.PathLike, ckpt_dir: str | os.PathLike, step: int = 1, world_size: int = 2) -> Path:
    """<ckpt_dir>/global_step_<step>/actor, written by `world_size` gloo ranks; returns that folder."""
    import socket

    import torch.multiprocessing as mp

    actor = Path(ckpt_dir) / f"global_step_{step}" / "actor"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world_size, port, str(model_dir), str(actor)), nprocs=world_size, join=True)
    (Path(ckpt_dir) / "latest_checkpointed_iteration.txt").write_text(str(step))  # as verl's trainer does after a save
    return actor


def standin_round(config) -> None:
    """What the stand-in TaskRunner does inside its Ray actor (see the module docstring)."""
    import pyarrow.parquet as pq
    import ray

    from verl.trainer.ppo.reward import get_custom_reward_fn

    score = get_custom_reward_fn(config)
    rows = pq.read_table(list(config.data.train_files)[0]).slice(0, 2).to_pylist()
    scores = []
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        for i in range(int(config.actor_rollout_ref.rollout.n)):
            text = f"So the answer is \\boxed{{{truth}}}." if i % 2 == 0 else "So the answer is \\boxed{-12345}."
            scores.append(score(data_source=row["data_source"], solution_str=text, ground_truth=truth,
                                extra_info=dict(row["extra_info"], num_turns=None, rollout_reward_scores={})))
    ckpt = Path(config.trainer.default_local_dir)
    write_fsdp_checkpoint(config.actor_rollout_ref.model.path, ckpt, step=1)
    runtime_env = ray.get_runtime_context().runtime_env or {}
    seen = {"model": config.actor_rollout_ref.model.path, "train_files": list(config.data.train_files),
            "n": int(config.actor_rollout_ref.rollout.n), "adv_estimator": config.algorithm.adv_estimator,
            "max_prompt_length": int(config.data.max_prompt_length),
            "env_vars": {k: v for k, v in os.environ.items() if k.startswith("MENTOR_")},
            "runtime_env_vars": dict(runtime_env.get("env_vars") or {}), "scores": scores, "cwd": os.getcwd()}
    (ckpt / "standin.json").write_text(json.dumps(seen, indent=1))


if __name__ == "__main__":
    import ray

    import verl.trainer.main_ppo as main_ppo

    here = str(Path(__file__).resolve().parent)

    @ray.remote(num_cpus=1)
    class StandinTaskRunner:
        def run(self, config):
            # As a module of its own (not __main__), so the processes it spawns for the checkpoint find it.
            sys.path.insert(0, here)
            import verl_standin

            verl_standin.standin_round(config)

    main_ppo.TaskRunnerV1 = StandinTaskRunner  # main() picks its TaskRunner by trainer.use_v1
    try:
        import verl.trainer.main_ppo_v0 as v0

        v0.TaskRunner = StandinTaskRunner
    except ImportError:
        pass
    sys.argv = ["verl.trainer.main_ppo", *sys.argv[1:]]
    main_ppo.main()
