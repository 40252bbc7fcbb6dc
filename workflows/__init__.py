"""Round-by-round workflow definitions (YAML) and their runner."""
