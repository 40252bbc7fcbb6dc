"""One module per stage: ingest, mine, hint, build, inspect, rollout."""
