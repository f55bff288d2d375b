"""Programs the toolkit did not start: install, run, and what they need (patches of jax)."""
