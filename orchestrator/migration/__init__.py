"""Moving a job between offers: the migration state machine (`machine`).

`TRANSITIONS` is the table of phase changes, one comment per edge; `advance` is the pure
step function the controller calls once per tick; actions come back as data for the
executor. The controller protocol (record, act, observe) is in `machine`'s docstring.
"""

from orchestrator.migration.machine import (
    DEFAULT_LIMITS,
    NOTHING_TO_MOVE,
    TERMINAL,
    TRANSITIONS,
    CheckpointSeen,
    CopyCheckpoint,
    Launch,
    Limits,
    Migration,
    MigrationAction,
    MigrationError,
    MigrationPhase,
    Observation,
    RequestCheckpoint,
    Terminate,
    advance,
)

__all__ = [
    "DEFAULT_LIMITS",
    "NOTHING_TO_MOVE",
    "TERMINAL",
    "TRANSITIONS",
    "CheckpointSeen",
    "CopyCheckpoint",
    "Launch",
    "Limits",
    "Migration",
    "MigrationAction",
    "MigrationError",
    "MigrationPhase",
    "Observation",
    "RequestCheckpoint",
    "Terminate",
    "advance",
]
