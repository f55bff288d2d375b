"""A one-line progress display while engines start: a widget in a notebook, a line on a terminal."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ['Progress']


class Progress:
    """A one-line progress display: a widget in a notebook, a line on a terminal."""

    def __init__(self, enabled: bool, label: str):
        self.enabled = enabled
        self.handle: Any = None
        self.last = label
        if enabled:
            try:
                from IPython import get_ipython
                from IPython.display import display

                if get_ipython() is not None:
                    self.handle = display({'text/plain': label}, raw=True, display_id=True)
            except ImportError:
                pass
            if self.handle is None:
                print(label, file=sys.stderr, flush=True)

    def update(self, text: str) -> None:
        if not self.enabled or text == self.last:
            return
        self.last = text
        if self.handle is not None:
            self.handle.update({'text/plain': text}, raw=True)
        else:
            print(text, file=sys.stderr, flush=True)
