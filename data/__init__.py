"""Small bundled data in the canonical schemas (see data/README.md)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent

# Bundled problem sets by name (what `--base`, `mentor rollout` and `--problems` accept).
BUNDLED_SETS = {"gsm8k": "gsm8k_problems.parquet", "math500": "math500_problems.parquet", "humaneval": "humaneval_problems.parquet"}


def bundled(name: str) -> Path:
    """Path of a bundled data file, e.g. ``bundled("gsm8k_rollouts.parquet")``."""
    path = DATA_DIR / name
    if not path.exists():
        available = sorted(p.name for p in DATA_DIR.glob("*.parquet"))
        raise FileNotFoundError(f"no bundled data file {name!r}; available: {available}")
    return path
