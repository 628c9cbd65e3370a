"""Errors shared by the stages.

A `Rejection` is a per-record outcome (the record goes to the ledger and the run goes on);
a `ConfigError` is the user's to fix before any work starts.
"""

REJECT_COLUMNS = ["source", "source_id", "url", "key", "stage", "reason", "detail"]  # a row of the rejection ledger


class Rejection(Exception):
    """One record cannot be published; `reason` is a short snake_case code, `detail` says why."""

    def __init__(self, stage: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{stage}/{reason}: {detail}" if detail else f"{stage}/{reason}")
        self.stage = stage
        self.reason = reason
        self.detail = detail


class ReasonError(Exception):
    """A failure with a ledger reason (a short snake_case code) and a detail saying why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ConfigError(ValueError):
    """The configuration is wrong; the message names the key and what is expected."""
