"""The verl trainer: its launcher (`LAUNCHER`), reward file, batches, checkpoints and Hydra config."""
