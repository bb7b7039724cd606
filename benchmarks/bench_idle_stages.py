"""Where an idle single-sentence request's time goes inside the application, without HTTP.

    .venv/bin/python benchmarks/bench_idle_stages.py [--engines fake,torch,onnx-int8,...]
        [--probes N] [--gap SECONDS]

Each engine serves the bundled all-MiniLM-L6-v2 (`fake`: the registered fake adapter, so that
only the application's own path is left) in an app built by `create_app`, called directly as an
ASGI app with an in-memory body: no socket, no HTTP parser. `--probes` single sentences go
through `POST /v1/embeddings` `--gap` seconds apart, and each request's stages are taken from
the `StageTimes` its run reported (the same ones behind the `x-*-time` headers). The `fake`
engine is also run back to back: the difference from its gapped run is what idling costs the
same code. Medians, ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from lib.engines import ENGINES, SOURCE  # noqa: E402

SENTENCE = "A man is playing a guitar on the street corner."
STAGES = ("entry to tokenizing", "tokenizing", "queue", "forward", "postprocess", "delivery", "response built")
WARM = 30


def model_entry(engine: str) -> dict[str, Any]:
    if engine == "fake":
        return {"name": "m", "source": "fake", "kind": "fake", "pin": True}
    return {"name": "m", "source": SOURCE, "device": "cpu", "pin": True, **ENGINES[engine]}


async def probe(engine: str, probes: int, gap: float) -> dict[str, float]:
    """Stage medians (ms) of `probes` single sentences `gap` seconds apart, after `WARM` of them."""
    from infinity_server.app import create_app
    from infinity_server.settings import ServerSettings, Settings
    from model_registry.config import registry_config
    from model_registry.runtime.timing import StageTimes

    settings = Settings(ServerSettings(access_log=False), registry_config({"models": [model_entry(engine)]}))
    app = create_app(settings)
    reported: list[StageTimes] = []
    on_stages = app.state.metrics.on_stages

    def keep(stages: Any) -> None:
        stages = list(stages)
        reported.extend(stages)
        on_stages(stages)

    app.state.metrics.on_stages = keep
    body = json.dumps({"model": "m", "input": [SENTENCE]}).encode()
    headers = [(b"host", b"bench"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/embeddings",
        "raw_path": b"/v1/embeddings",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }

    async def one() -> tuple[float, float]:
        """Wall-clock (`time.time`, as `StageTimes`) of the app's entry and of its response start."""
        delivered = False
        started: list[float] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # no disconnect while the request runs
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if message["status"] != 200:
                    raise RuntimeError(f"the app answered {message['status']}")
                started.append(time.time())

        entry = time.time()
        await app(dict(scope), receive, send)
        return entry, started[0]

    rows: list[tuple[float, ...]] = []
    async with app.router.lifespan_context(app):
        for i in range(WARM + probes):
            entry, response = await one()
            times = reported[-1]
            batch = times.batches[0]
            if i >= WARM:
                rows.append(
                    (
                        times.prepare_start - entry,
                        times.enqueued - times.prepare_start,
                        batch.forward_start - times.enqueued,
                        batch.forward_end - batch.forward_start,
                        batch.postprocess_end - batch.forward_end,
                        times.finished - batch.postprocess_end,
                        response - times.finished,
                        response - entry,
                    )
                )
            await asyncio.sleep(gap)
    return {
        name: statistics.median(column) * 1e3
        for name, column in zip((*STAGES, "total"), zip(*rows, strict=True), strict=True)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="fake,torch,onnx-int8,ctranslate2-int8")
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.041, help="seconds between probes (the server's pace)")
    args = parser.parse_args()
    runs = [(name, args.gap) for name in args.engines.split(",")]
    if "fake" in args.engines.split(","):
        runs.append(("fake", 0.0))
    print(f"| engine | gap (ms) | {' | '.join(STAGES)} | to the response start |")
    print("|---|---|" + "---|" * (len(STAGES) + 1))
    for name, gap in runs:
        figures = asyncio.run(probe(name, args.probes, gap))
        cells = " | ".join(f"{figures[stage]:.2f}" for stage in (*STAGES, "total"))
        print(f"| {name} | {gap * 1e3:.0f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
