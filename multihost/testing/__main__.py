"""``python -m multihost.testing --worker ...``: one simulated host of a `LocalCluster`."""

from __future__ import annotations

import sys

from multihost.testing._worker import main

if __name__ == '__main__':
    main(sys.argv)
