"""Soak: many models in a memory budget for a few, mixed traffic from concurrent clients.

    python benchmarks/soak.py [--requests 2000] [--clients 16] [--models 10] [--fit 3]

Runs the same traffic twice against a real server on a loopback port, in this process:
1. with a budget for `--fit` models: models load on demand and idle ones are evicted (LRU);
2. the naive baseline: every model loaded at start (pinned), with no budget to keep.
and prints requests per second, p50/p99 latency, loads, evictions, and the process's RSS growth
for both, with their ratios. Fake models really hold their declared bytes, so RSS is honest.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders.soak import MIB, RssSampler, SoakResult, drive, soak_models  # noqa: E402


def serve_in_thread(config: dict[str, Any]) -> tuple[Any, str, Any]:
    """A Hypercorn server on a free loopback port: (app, url, stop function)."""
    import socket

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(Settings(ServerSettings(), registry_config(config)))
    hyper = Config()
    hyper.bind, hyper.accesslog, hyper.graceful_timeout = [f"127.0.0.1:{port}"], None, 1
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(app, hyper, shutdown_trigger=stop.wait),))  # type: ignore[arg-type]
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)

    def close() -> None:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)

    return app, url, close


def run(config: dict[str, Any], *, requests: int, clients: int, models: int) -> tuple[SoakResult, list[Any]]:
    with RssSampler() as rss:  # from before the server starts: pinned models load at start
        app, url, close = serve_in_thread(config)
        try:
            result = asyncio.run(drive(url, requests=requests, clients=clients, models=models))
        finally:
            close()
    result.peak_rss = rss.growth
    return result, app.state.registry.events


def report(label: str, result: SoakResult, events: list[Any]) -> None:
    kinds = Counter(e.kind.value for e in events)
    print(
        f"{label:>9}: {sum(result.statuses.values()) / result.seconds:7.1f} req/s  "
        f"p50 {1000 * result.percentile(50):6.1f} ms  p99 {1000 * result.percentile(99):7.1f} ms  "
        f"loads {kinds['loaded']:4d}  evictions {kinds['evicted']:4d}  "
        f"RSS growth {result.peak_rss / MIB:6.1f} MiB  statuses {dict(result.statuses)}"
    )
    for kind in ("loaded", "evicted"):
        seconds = [e.seconds for e in events if e.kind.value == kind]
        if seconds:
            print(f"{'':>11}{kind}: {len(seconds)} x {1000 * float(np.mean(seconds)):.1f} ms on average")
    for message, count in result.errors.most_common(3):
        print(f"{'':>11}{count} x {message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--fit", type=int, default=3)
    parser.add_argument("--mib", type=int, default=20)
    args = parser.parse_args()
    shape = {"requests": args.requests, "clients": args.clients, "models": args.models}
    budget = int((args.fit + 0.5) * args.mib * MIB)
    lifecycle = run({"models": soak_models(args.models, args.mib), "memory_budget": budget}, **shape)
    baseline = run({"models": soak_models(args.models, args.mib, pinned=True)}, **shape)
    print(f"{args.requests} requests, {args.clients} clients, {args.models} models of {args.mib} MiB")
    report(f"budget {args.fit}", *lifecycle)
    report("all in", *baseline)
    ours, naive = lifecycle[0], baseline[0]
    print(
        f"ratios (budget / all loaded): throughput {naive.seconds / ours.seconds:.2f}, "
        f"p99 {ours.percentile(99) / naive.percentile(99):.2f}, RSS growth {ours.peak_rss / max(1, naive.peak_rss):.2f}"
    )


if __name__ == "__main__":
    main()
