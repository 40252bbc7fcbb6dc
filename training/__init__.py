"""Trainer integration: verifiers, OpenRLHF/verl reward functions, launcher."""
