"""The tree diff model's old home: it lives in `multihost._models._treediff` now.

Re-exported here so old imports and old pickles still resolve.
"""

from multihost._models._treediff import (  # noqa: F401  (the models live there; re-exported)
    MAX_TEXT_CHARS,
    SMALL_LEAF,
    GlobalLeaf,
    LeafDiff,
    TreeDiff,
    describe_blocks,
)
