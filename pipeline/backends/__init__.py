"""The LLM backends: one module per kind, each declaring ``BACKEND``."""
