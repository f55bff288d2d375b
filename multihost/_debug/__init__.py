"""Debugging a running job: stacks, the step gate, watched launches, wavefront, timeline.

Plus the control socket the notebook reaches while an engine is busy.
"""
