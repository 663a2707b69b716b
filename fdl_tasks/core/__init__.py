"""core: TODO."""
