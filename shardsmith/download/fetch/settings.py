"""The `download:` settings of a job (FetchSettings, defaults as in the schema) and its retry policy: which
reasons are retried, and the backoff between attempts."""

import random
import re
from dataclasses import dataclass, fields

from shardsmith import PROJECT_URL, __version__

# Transient reasons: retried within a job (except `deadline`) and refetched by a retry run. As in the schema.
DEFAULT_RETRY_REASONS = (
    "timeout", "connection_error", "dns_error", "server_error", "rate_limited", "truncated_download",
    "unreachable", "s3_error", "deadline", "robots_unavailable", "tdmrep_unavailable",
)  # fmt: skip
# Decided once per job: retried by a later run, not within the job (the job keeps its answer).
RETRY_NEXT_RUN_ONLY = ("deadline", "robots_unavailable", "tdmrep_unavailable")
DEFAULT_OPTOUT_DIRECTIVES = ("noai", "noimageai", "noindex", "noimageindex")  # img2dataset's defaults
DEFAULT_USER_AGENT = (
    f"shardsmith/{__version__} (+{PROJECT_URL}/blob/main/docs/crawler.md; image-caption dataset builder; "
    "honours robots.txt, TDMRep and X-Robots-Tag noai)"
)


@dataclass(frozen=True)
class FetchSettings:
    """The `download:` config section; defaults as in config/config.schema.yaml."""

    concurrency: int = 32  # requests in flight at the start, grown up to max_concurrency (see dispatch.InFlight)
    max_concurrency: int = 128
    per_host_concurrency: int = 8
    per_host_rate: float | None = None  # request starts per second per host; None: no limit
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0  # longest silence between two reads
    request_timeout_s: float = 60.0  # a whole image response, so a slow trickle cannot go on for ever
    retries: int = 3  # further attempts after the first, for retry_reasons
    backoff_s: float = 1.0  # wait before retry n: backoff_s * 2**(n-1), times a jitter in [0.5, 1.5)
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 120.0  # cap on a server's Retry-After
    max_bytes: int = 50_000_000
    max_buffered_mb: int = 256  # bodies held in memory at once across a job's requests (see _ByteBudget)
    max_redirects: int = 5
    user_agent: str = DEFAULT_USER_AGENT
    respect_optout: bool = True
    optout_directives: tuple[str, ...] = DEFAULT_OPTOUT_DIRECTIVES
    respect_robots_txt: bool = True
    respect_tdm_reservation: bool = True
    allow_networks: tuple[str, ...] = ()  # CIDRs the network guard lets through (a site's mirror, loopback tests)
    allow_hosts: tuple[str, ...] = ()  # host names it lets through unchecked ('.example.org': the domain too)
    allow_local_folders: tuple[str, ...] = ()  # beside the source's own folder (see Fetcher)
    part_deadline_s: float | None = 3600.0
    retry_reasons: tuple[str, ...] = DEFAULT_RETRY_REASONS
    progress_every: int = 1000  # log a progress line every this many records (and at least every 60 s)

    @classmethod
    def from_config(cls, config: "dict | FetchSettings | None") -> "FetchSettings":
        if isinstance(config, FetchSettings):
            return config
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (config or {}).items() if k in known}
        for k in ("optout_directives", "retry_reasons", "allow_networks", "allow_hosts", "allow_local_folders"):
            if k in values:
                values[k] = tuple(values[k])
        return cls(**values)

    @property
    def ua_token(self) -> str:
        """The product token of the user agent (`shardsmith`), matched against `X-Robots-Tag: <token>: noai`."""
        return re.split(r"[/\s]", self.user_agent.strip(), maxsplit=1)[0].lower()


def backoff_wait(s: FetchSettings, attempt: int) -> float:
    """Seconds to wait before retry `attempt` (1-based): doubling from backoff_s up to backoff_max_s, times a
    jitter in [0.5, 1.5) so that a host's failed requests do not all come back at once."""
    return min(s.backoff_max_s, s.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
