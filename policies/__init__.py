"""Policies: pure functions from a `Snapshot` to a `Decision`.

A policy imports only `orchestrator.model`, `orchestrator.units`, `orchestrator.catalog`
and numpy/scipy; it does no I/O and reads no clock, so it cannot tell replay from live.
`registry.py` maps policy names to constructors.
"""
