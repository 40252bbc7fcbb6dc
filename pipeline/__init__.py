"""The framework: schemas, Parquet I/O, configs, errors, LLM backend seam, CLI."""
