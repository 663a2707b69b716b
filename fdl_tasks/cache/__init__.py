"""cache: TODO."""
