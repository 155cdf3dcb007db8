"""Errors raised by the workload generator."""

from __future__ import annotations


class WorkloadConfigError(ValueError):
    """A workload configuration is invalid.

    ``field`` is the dotted path of the offending key (``workload.parallelism.tp``) and
    ``position`` is ``"file:line:column"`` when the value came from a YAML file, so that the
    message points the user at the exact spot to fix.
    """

    def __init__(self, message: str, field: str = "", position: str = "") -> None:
        self.field = field
        self.position = position
        self.reason = message
        prefix = f"{position}: " if position else ""
        where = f"{field}: " if field else ""
        super().__init__(f"{prefix}{where}{message}")
