"""What the operations middleware costs per request: ids, timing headers, metrics, keys, drain, spans.

    .venv/bin/python benchmarks/bench_edge.py [--requests 2000] [--rounds 3]

In-process (httpx's ASGI transport, no sockets), the fake model with no delay, one request at a
time, so that the edge is as large a share of the time as it can be. The naive baseline serves
the same routes with no middleware; the full app has a key, the access log (to a null handler),
stage metrics and, in the third line, OpenTelemetry spans to an SDK provider that drops them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

import httpx
from starlette.applications import Starlette

from infinity_server.app import ROUTES, create_app
from infinity_server.metrics import Metrics
from infinity_server.settings import ServerSettings, Settings
from lib.machine import cpu
from model_registry import Registry
from model_registry.config import registry_config

BODY = {"model": "fake", "input": ["a short query"]}
MODELS = {"models": [{"name": "fake", "source": "fake", "kind": "fake", "pin": True}]}


def baseline(registry: Registry, settings: Settings) -> Starlette:
    app = Starlette(routes=ROUTES)
    app.state.registry, app.state.settings, app.state.metrics = registry, settings, Metrics()
    return app


async def per_request_us(app: Any, requests: int, headers: dict[str, str]) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", headers=headers) as client:
        for _ in range(50):  # warm-up
            (await client.post("/v1/embeddings", json=BODY)).raise_for_status()
        started = time.perf_counter()
        for _ in range(requests):
            (await client.post("/v1/embeddings", json=BODY)).raise_for_status()
        return (time.perf_counter() - started) / requests * 1e6


def tracer_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider()  # records spans, exports nowhere


async def main(requests: int, rounds: int) -> None:
    logging.getLogger("infinity_server.access").addHandler(logging.NullHandler())
    logging.getLogger("infinity_server.access").propagate = False
    settings = Settings(ServerSettings(api_key="bench"), registry_config(MODELS))
    auth = {"Authorization": "Bearer bench"}
    async with Registry(settings.registry) as registry:
        apps = {
            "baseline (routes only)": (baseline(registry, settings), {}),
            "full middleware": (create_app(settings, registry), auth),
            "full + tracing": (create_app(settings, registry, tracer_provider=tracer_provider()), auth),
        }
        results: dict[str, list[float]] = {name: [] for name in apps}
        for _ in range(rounds):  # interleaved, so that load changes hit every variant alike
            for name, (app, headers) in apps.items():
                results[name].append(await per_request_us(app, requests, headers))
    base = min(results["baseline (routes only)"])
    print(f"load average {os.getloadavg()}, {cpu()}")
    for name, values in results.items():
        best = min(values)
        print(f"{name:24s} {best:8.1f} us/request  x{best / base:.2f}  (+{best - base:.1f} us)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
