"""config: TODO."""
