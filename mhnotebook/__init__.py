"""mhnotebook: the notebook side (sessions, magics, widgets). Under construction."""

__all__: list[str] = []
