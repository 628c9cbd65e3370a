"""The fetching process alone, on the simulated internet: shardsmith's Fetcher with libcurl against the same
Fetcher with urllib3 underneath, same URLs, same threads, alternating.

    python bench/fetch_bench.py [--count 4000] [--hosts 1000] [--rounds 2] [--in-flight 32] [--parts 2]

Serves the web-size image set of bench/e2e_bench.py through bench/simnet.py (HTTPS, a certificate per host,
a resolver 20 ms away, round trips of 20-200 ms, a Zipf spread of images over hosts) and runs, in the
simulated internet's namespace, one process per client and round that fetches `--count` URLs as `--parts`
download jobs one after the other, cut as planning cuts a manifest and sharing one policy cache (robots.txt,
tdmrep.json), as a run's parts do.
Only the fetching is measured: bodies are dropped, nothing is written. Reports the process's CPU per record
(user and system), wall time, and the server's counters (lookups, handshakes, resumed sessions, requests per
connection, policy requests per origin); raw figures go to bench/results/fetch-simnet.json.

The urllib3 client is the transport the Fetcher had before libcurl: urllib3's pool manager with the network
guard's connections (one lookup per host per job through the guard's cache in both), bodies read into a
buffer of the declared length. Exploring: FETCH_BENCH_SETTINGS (JSON) overrides download settings,
FETCH_BENCH_NO_CACHE=1 leaves the policy cache out, FETCH_BENCH_CONSECUTIVE=1 cuts the parts as consecutive
rows (planning puts a host's few records in one part), FETCH_BENCH_PROFILE=FILE writes a yappi profile of every
thread (pip install yappi)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLIENTS = ("urllib3", "curl")


def _urllib3_fetcher():
    """A Fetcher whose requests go through urllib3 (see the module docstring)."""
    import urllib3

    from shardsmith.download.fetch.client import Fetcher
    from shardsmith.download.fetch.curl import SKIP_BODY, Head, Reply

    class Urllib3Fetcher(Fetcher):
        def _get(self, url, stop_at, max_bytes, on_head=None):
            try:
                resp = self._request(url)
            except urllib3.exceptions.TimeoutError as e:
                return Reply(None, b"", 0, (28, str(e)))
            except urllib3.exceptions.HTTPError as e:
                return Reply(None, b"", 0, (7, str(e)))
            head = Head(resp.status, resp.reason or "")
            for name, value in resp.headers.items():
                head.add(name, value)
            try:
                said = on_head(head) if on_head else None
            except BaseException as e:
                resp.close()
                resp.release_conn()
                return Reply(head, b"", 0, None, e)
            if said is SKIP_BODY:
                resp.drain_conn()
                resp.release_conn()
                return Reply(head, b"", 0)
            body = resp.read(max_bytes + 1)
            resp.release_conn()
            return Reply(head, body[:max_bytes], len(body), (23, "over max_bytes") if len(body) > max_bytes else None)

    return Urllib3Fetcher


def worker(client: str, urls_file: Path, parts: int, in_flight: int) -> None:
    """Runs in the namespace: fetch the URLs as `parts` jobs in turn; prints one JSON line of figures."""
    from shardsmith.download.fetch.client import Fetcher
    from shardsmith.download.fetch.policycache import PolicyCache
    from shardsmith.download.fetch.settings import FetchSettings
    from shardsmith.download.sources import host_sorted

    urls = json.loads(urls_file.read_text())
    settings = FetchSettings(
        concurrency=in_flight,
        max_concurrency=in_flight,
        **{"per_host_concurrency": 32, "retries": 0, "allow_networks": ("127.0.0.0/8",)}
        | json.loads(os.environ.get("FETCH_BENCH_SETTINGS", "{}")),  # exploring: other download settings
    )
    cls = _urllib3_fetcher() if client == "urllib3" else Fetcher
    ok = failed = 0
    reasons: dict[str, int] = {}
    logs: list[str] = []
    profile = os.environ.get("FETCH_BENCH_PROFILE")  # a file: yappi's CPU profile of every thread goes there
    if profile:
        import yappi

        yappi.set_clock_type("cpu")
        yappi.start()
    t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as policy:
        size = -(-len(urls) // parts)
        if os.environ.get("FETCH_BENCH_CONSECUTIVE"):
            chunks = [urls[p * size : (p + 1) * size] for p in range(parts)]
        else:  # as planning cuts a manifest into parts: a host's few records in one part
            chunks = [[r["url"] for r in part] for part in host_sorted([{"url": u} for u in urls], size)]
        for p, chunk in enumerate(chunks):
            cache = None if os.environ.get("FETCH_BENCH_NO_CACHE") else PolicyCache(policy)
            fetcher = cls(settings, log=logs.append, policy_cache=cache)

            def done(jid, outcome):
                nonlocal ok, failed
                ok += outcome.ok
                failed += not outcome.ok
                if not outcome.ok:
                    reasons[outcome.reason] = reasons.get(outcome.reason, 0) + 1

            fetcher.fetch_all([(i, u, None) for i, u in enumerate(chunk)], done, label=f"part{p}")
    wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
    if profile:
        yappi.stop()
        with open(profile, "w") as f:
            columns = {0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8)}
            yappi.get_func_stats().sort("tsub").print_all(out=f, columns=columns)
    n = len(urls)
    print(
        json.dumps(
            {
                "client": client,
                "records": n,
                "ok": ok,
                "failed": failed,
                "reasons": reasons,
                "wall_s": round(wall, 2),
                "cpu_ms_per_record": round((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1000, 3),
                "user_ms_per_record": round((r1.ru_utime - r0.ru_utime) / n * 1000, 3),
                "system_ms_per_record": round((r1.ru_stime - r0.ru_stime) / n * 1000, 3),
                "traffic": [line for line in logs if "HTTP requests" in line],
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--hosts", type=int, help="host names (default count / 4)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--parts", type=int, default=2, help="jobs fetching the URLs in turn, sharing a policy cache")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fetch-simnet.json")
    ap.add_argument("--worker", nargs=2, metavar=("CLIENT", "URLS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], Path(a.worker[1]), a.parts, a.in_flight)
        return

    from bench import simnet
    from bench.e2e_bench import MIXES, prepare

    mix = MIXES["web-size"]
    data = prepare(a.count, mix["large_share"], a.seed, mix["large_formats"], mix["small_sides"])
    names = [r["name"] for r in json.loads((data / "imageset.json").read_text())][: a.count]
    runs: list[dict] = []
    with simnet.SimNet(data / "images", hosts=a.hosts or max(1, a.count // 4), seed=a.seed) as net:
        hosts = simnet.assign(names, net.names, a.seed)
        urls_file = net.dir / "urls.json"
        urls_file.write_text(json.dumps([net.url(h, n) for h, n in zip(hosts, names)]))
        clients = a.clients.split(",")
        for r in range(a.rounds):
            for client in clients if r % 2 == 0 else clients[::-1]:
                before = net.snapshot()
                cmd = [sys.executable, __file__, "--worker", client, str(urls_file), "--parts", str(a.parts),
                       "--in-flight", str(a.in_flight)]  # fmt: skip
                out = subprocess.run(
                    simnet.wrap(cmd, net), env=simnet.client_env(net), capture_output=True, text=True, check=False
                )
                if out.returncode:
                    sys.exit(f"{client} failed:\n{out.stderr[-3000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run["simnet"] = simnet.summary(net.snapshot(), before, images=a.count)
                run["round"] = r
                runs.append(run)
                print(
                    f"round {r} {client}: {run['cpu_ms_per_record']} ms CPU a record "
                    f"({run['user_ms_per_record']} user), {run['wall_s']} s, {run['ok']} ok",
                    flush=True,
                )
        facts = {"hosts": len(net.names), "spread": simnet.spread(hosts), "rtt_ms": net.rtt_ms, "dns_ms": net.dns_ms}

    def med(client: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["client"] == client)

    result = {
        "count": a.count,
        "parts": a.parts,
        "in_flight": a.in_flight,
        "simnet": facts,
        "median": {
            c: {k: med(c, k) for k in ("cpu_ms_per_record", "user_ms_per_record", "system_ms_per_record", "wall_s")}
            for c in clients
        },
        "runs": runs,
        "machine": {"cpus": os.cpu_count()},
        "command": " ".join(sys.argv[1:]),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["median"], indent=1))


if __name__ == "__main__":
    main()
