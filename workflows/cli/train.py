"""`mentor train`: one GRPO round of OpenRLHF, TRL or verl (training/)."""

from __future__ import annotations

import json

import click

from mentor.stages.hint.live import hint_config
from mentor.training.launcher import load_round

# Its commands: name -> the line `mentor --help` shows (read without importing this module; keep it in step).
COMMANDS = {
    "train": "Run one GRPO round (OpenRLHF, verl or TRL) from round.yaml (--dry-run prints the command).",
}


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The round's round.yaml: `kind` picks the trainer (openrlhf, the default: training/openrlhf/launcher.py "
                   "TrainConfig; trl: training/trl/launcher.py TrlTrainConfig + GRPOConfig fields; verl: "
                   "training/verl/config.py VerlTrainConfig + verl overrides).")
@click.option("--dry-run", is_flag=True,
              help="Check the round and print the exact trainer command and environment, run nothing: the trainer's own "
                   "checks (OpenRLHF's launch code, verl's Hydra config and validate_config, TRL's GRPOConfig), the GPUs "
                   "it needs, the longest prompt and the reward load.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Before launch, refuse a round the GPUs cannot place or whose rollout log dir the Ray workers cannot "
                   "reach (OpenRLHF and verl: the round config's preflight).")
def train(config_path, dry_run, check):
    """Run one GRPO round from round.yaml: OpenRLHF (python -m openrlhf.cli.train_ppo_ray), TRL with kind: trl,
    or verl (python -m verl.trainer.main_ppo, then verl's model merger) with kind: verl."""
    launcher, cfg = load_round(config_path)
    if getattr(cfg, "live_hints", None) is not None:  # the hint agents' settings: the hint stage's checks, before launch
        hint_config(cfg.live_hints, f"{config_path}: live_hints")
    if not check and "preflight" in type(cfg).model_fields:
        cfg = cfg.model_copy(update={"preflight": False})
    if dry_run:
        click.echo(launcher.check(cfg))
        return
    outcome = launcher.run_round(cfg)
    click.echo(json.dumps({"round": outcome["round"], **{k: outcome.get(k) for k in launcher.summary}}, sort_keys=True))
