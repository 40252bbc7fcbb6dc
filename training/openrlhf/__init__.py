"""The OpenRLHF trainer: its launcher (`LAUNCHER`), reward file, launch-code check and GPU placement."""
