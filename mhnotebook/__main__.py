"""``python -m mhnotebook demo``: see `mhnotebook._demo`."""

import sys

from mhnotebook._demo import main

sys.exit(main())
