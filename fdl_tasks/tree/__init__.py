"""tree: TODO."""
