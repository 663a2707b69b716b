"""timings: TODO."""
