"""Gathered blocks from the engines to the notebook: /dev/shm files and a tcp stream."""
