"""gpu: TODO."""
