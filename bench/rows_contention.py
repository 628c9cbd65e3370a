"""What torch's CPU thread pool costs the embedding job's own process when the DataLoader workers hold the cores.

    python bench/rows_contention.py                       # writes bench/results/rows-contention.json

Beside a GPU, the job's process does little CPU work of its own: each batch's rows (`batch_rows`: unit
embeddings, similarities, norms, fp16) once the GPU's results are back. Its workers keep every other core
busy. Here `batch_rows` runs on a batch of 512 (ViT-B-32's and ViT-L-14's embedding sizes) with torch's
threads at all cores and at one (`shardsmith.embed.part.main_threads` beside a GPU), with no other load and
with one busy process a core but one (the workers); ms a batch, and the ratio of all threads to one.
"""

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shardsmith.embed.part import batch_rows


def _busy(stop) -> None:
    """A worker's load: a core kept busy until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def rows_ms(dim: int, batch: int, rounds: int) -> float:
    """Median ms of `batch_rows` on one batch of random raw embeddings."""
    image, text = torch.randn(batch, dim), torch.randn(batch, dim)
    batch_rows(image, text)  # warm-up: the thread pool starts
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        batch_rows(image, text)
        times.append((time.perf_counter() - start) * 1e3)
    return round(sorted(times)[len(times) // 2], 2)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rows-contention.json"))
    a = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    previous = torch.get_num_threads()
    results = []
    try:
        for busy in (0, max(1, cores - 1)):
            stop = multiprocessing.get_context("fork").Event()
            procs = [multiprocessing.get_context("fork").Process(target=_busy, args=(stop,)) for _ in range(busy)]
            for p in procs:
                p.start()
            try:
                for dim in (512, 768):
                    row = {"busy_processes": busy, "dim": dim, "batch": a.batch}
                    for threads in (cores, 1):
                        torch.set_num_threads(threads)
                        row[f"ms_threads_{threads}" if threads == 1 else "ms_threads_all"] = rows_ms(
                            dim, a.batch, a.rounds
                        )
                    row["all_over_one"] = round(row["ms_threads_all"] / row["ms_threads_1"], 2)
                    results.append(row)
                    print(row, flush=True)
            finally:
                stop.set()
                for p in procs:
                    p.join()
    finally:
        torch.set_num_threads(previous)
    out = {
        "what": "shardsmith.embed.part.batch_rows, ms per batch, torch threads at all cores and at one, with and "
        "without a busy process on every core but one (standing in for the DataLoader workers)",
        "cores": cores,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "results": results,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return out


if __name__ == "__main__":
    main()
