"""Starting and connecting the engines: local clusters, launchers, JAX initialization."""
