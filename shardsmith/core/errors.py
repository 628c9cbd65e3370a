"""Errors shared by the stages.

A `Rejection` is a per-record outcome (the record goes to the ledger and the run goes on);
a `ConfigError` is the user's to fix before any work starts.
"""


class ReasonError(Exception):
    """The base of every failure with a ledger reason (a short snake_case code) and a detail saying why.

    The message is "reason: detail"; a class whose detail is already the whole message a user should see
    sets `detail_is_message`.
    """

    detail_is_message = False

    def __init__(self, reason: str, detail: str = "", message: str | None = None) -> None:
        if message is None:
            message = detail if self.detail_is_message else f"{reason}: {detail}"
        super().__init__(message)
        self.reason = reason
        self.detail = detail


class Rejection(ReasonError):
    """One record cannot be published at `stage`; it goes to the ledger and the run goes on."""

    def __init__(self, stage: str, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail, f"{stage}/{reason}: {detail}" if detail else f"{stage}/{reason}")
        self.stage = stage


class ConfigError(ValueError):
    """The configuration is wrong; the message names the key and what is expected."""
