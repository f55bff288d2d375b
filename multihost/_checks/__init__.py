"""Checks across hosts: one collective in, one frozen model out.

Tree diff, layouts, replicas, the census, non-finite values.
"""
