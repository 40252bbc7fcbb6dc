"""`mentor train`: one GRPO round of OpenRLHF, TRL or verl (training/)."""

from __future__ import annotations

import json

import click

from mentor.pipeline.errors import ConfigError


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The round's round.yaml: OpenRLHF (training/launcher.py TrainConfig); with kind: trl, "
                   "TRL (training/trl_launcher.py TrlTrainConfig + GRPOConfig fields); with kind: verl, verl "
                   "(training/verl_launcher.py VerlTrainConfig + verl overrides).")
@click.option("--dry-run", is_flag=True,
              help="Print the exact trainer command and environment (OpenRLHF: and the GPUs the round needs; TRL: and the "
                   "resolved GRPOConfig; verl: checked by verl's own config code, and its GPUs); run nothing, check no cluster.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="OpenRLHF: check the command with OpenRLHF's own launch code first (its parser and checks, when openrlhf "
                   "is installed), then refuse a round the GPUs cannot place or whose rollout log dir the Ray workers cannot "
                   "reach (TrainConfig preflight); verl: the same refusals (verl's config check always runs).")
def train(config_path, dry_run, check):
    """Run one GRPO round from round.yaml: OpenRLHF (python -m openrlhf.cli.train_ppo_ray), TRL with kind: trl,
    or verl (python -m verl.trainer.main_ppo, then verl's model merger) with kind: verl."""
    from mentor.pipeline.yaml_io import read_yaml_mapping

    kind = read_yaml_mapping(config_path, "round settings").get("kind")
    if kind == "trl":
        return _train_trl(config_path, dry_run)
    if kind == "verl":
        return _train_verl(config_path, dry_run, check)
    from mentor.training.launcher import dry_run_text, load_config, round_command, run_round
    from mentor.training.openrlhf_check import check_with_openrlhf

    cfg = load_config(config_path)
    cmd, found = round_command(cfg, dry_run=True)
    args = None
    if check:
        try:
            args, notes = check_with_openrlhf(cmd)
        except ConfigError as exc:
            if "not installed" not in str(exc):
                raise
            click.echo(f"note: {exc}; the command and its GPUs were not checked", err=True)
        else:
            for note in notes:  # OpenRLHF's own warnings about the flags ("[Warning] ...")
                click.echo(f"openrlhf: {note}", err=True)
    else:
        cfg = cfg.model_copy(update={"preflight": False})
    if dry_run:
        click.echo(dry_run_text(cfg, args, (cmd, found)))
        return
    outcome = run_round(cfg)
    click.echo(json.dumps({k: outcome[k] for k in ("round", "exit_code", "final_model", "log_file", "duration_s")}, sort_keys=True))


def _train_trl(config_path, dry_run):
    from mentor.training.trl_launcher import dry_run_text, load_config, run_round

    cfg = load_config(config_path)
    if dry_run:
        click.echo(dry_run_text(cfg))
        return
    outcome = run_round(cfg)
    click.echo(json.dumps({k: outcome[k] for k in ("round", "exit_code", "final_model", "log_file", "steps", "duration_s")}, sort_keys=True))


def _train_verl(config_path, dry_run, check):
    from mentor.training.verl_launcher import dry_run_text, load_config, run_round

    cfg = load_config(config_path)
    if not check:
        cfg = cfg.model_copy(update={"preflight": False})
    if dry_run:
        click.echo(dry_run_text(cfg))
        return
    outcome = run_round(cfg)
    click.echo(json.dumps({k: outcome[k] for k in ("round", "exit_code", "final_model", "log_file", "steps", "duration_s")}, sort_keys=True))
