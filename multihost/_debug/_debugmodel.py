"""The debugging model's old home: the step table and the stack model live in `_models` now.

`multihost._models._steps` holds `StepTable` (host x step), `multihost._models._stacks` holds
`HostStacks` (where one host is) and the frame classification. This module re-exports them so
old imports and old pickles still resolve.
"""

from __future__ import annotations

from multihost._cells import cell_number as cell_number
from multihost._cells import is_cell as is_cell
from multihost._models._stacks import (  # noqa: F401  (the models live there; re-exported)
    DEVICE_WAITS,
    FRAMEWORKS,
    OURS,
    Frame,
    HostStacks,
    ThreadStack,
    background_words,
    display_path,
    display_site,
    frame_package,
    frame_words,
    framework_summary,
    is_user_frame,
    stack_activity,
    waiting_words,
)
from multihost._models._steps import (  # noqa: F401  (the models live there; re-exported)
    HeldLaunch,
    Step,
    StepTable,
)
