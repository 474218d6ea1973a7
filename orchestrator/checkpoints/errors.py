"""Errors of the checkpoint store."""

from __future__ import annotations

from orchestrator.errors import PermanentError


class CorruptCheckpoint(PermanentError):
    """A published checkpoint does not match its manifest (or the manifest its reference).

    `uri` is the checkpoint directory, `file` the file that differs ("manifest.json" for the
    manifest itself) and `reason` what differs, e.g. "sha256 differs (manifest 1a2b…, read 9f8e…)".
    """

    def __init__(self, uri: str, file: str, reason: str) -> None:
        super().__init__(f"{uri}/{file}: {reason}")
        self.uri = uri
        self.file = file
        self.reason = reason

    def __reduce__(self) -> tuple[type[CorruptCheckpoint], tuple[str, str, str]]:
        # picklable, so that it crosses processes (torch.distributed gathers it)
        return (CorruptCheckpoint, (self.uri, self.file, self.reason))


class CheckpointExists(PermanentError):
    """A different checkpoint is already published at this job and step; nothing was changed."""
