"""The TRL trainer: its launcher (`LAUNCHER`), reward, round process (`train`) and live hints (`live`)."""
