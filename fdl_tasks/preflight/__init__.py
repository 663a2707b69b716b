"""preflight: TODO."""
