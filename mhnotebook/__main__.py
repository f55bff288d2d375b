"""``python -m mhnotebook demo``: the ``mhnotebook`` command; see `mhnotebook._demo`."""

import sys

from mhnotebook._demo import main

sys.exit(main(prog='python -m mhnotebook'))
