"""The exchange: the only talkers to the coordination service.

Key-value rounds (`_kv`), the collective sequence (`_sequence`), the debug bus (`_bus`).
"""
