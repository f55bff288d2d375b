"""The drop-in core: multihost_utils' collectives, array conversions, preemption, live devices."""
