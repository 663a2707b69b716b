"""ssh: TODO."""
