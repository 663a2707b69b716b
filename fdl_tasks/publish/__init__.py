"""publish: TODO."""
