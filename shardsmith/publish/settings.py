"""The publish settings that the orchestrator and both kinds of destination read (mounted path, S3)."""

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class PublishSettings:
    """The `publish` config section, minus `dest` and `dedupe` (see the schema for each key)."""

    keep_versions: int | None = None
    verify: str = "readback"
    multipart_threshold: int | str | None = None
    multipart_chunksize: int | str | None = None
    max_concurrent_requests: int | None = None
    hardlink: bool = True

    @classmethod
    def from_config(cls, section: dict) -> "PublishSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in section.items() if k in names})

    def cli_config(self) -> dict[str, str]:
        """AWS CLI `s3` settings to set (only those given)."""
        keys = ("multipart_threshold", "multipart_chunksize", "max_concurrent_requests")
        return {k: str(getattr(self, k)) for k in keys if getattr(self, k) is not None}
