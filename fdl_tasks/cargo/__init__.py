"""cargo: TODO."""
