"""Images per second for a CLIP model over HTTP (multipart upload and data URIs) against the same
model called in-process with transformers, on the same images, in the same run.

    .venv/bin/python benchmarks/bench_images.py [--rounds N] [--images N] [--size WxH] [--whole-jpeg] [--json OUT]

Builds a small random CLIP (ViT with 224 px images, patch 32, 6 layers of width 384: ~50 patches per
image) in a temporary directory (no download), derives JPEG images of several sizes from the real
photo in the data folder (`lib/datasets.py`; with `--size`, crops of it all resized to that size,
such as a phone camera's 4032x3024), starts `infinity-server serve` on a free loopback port (with
`--whole-jpeg`, `scaled_jpeg: false`), then in rounds (interleaved, so drift on a shared machine
hits every method alike):
1. in-process: for each batch of 16, decode with Pillow, `CLIPImageProcessor`, `get_image_features`;
2. HTTP multipart: 2 concurrent clients, 16 files per `POST /v1/embeddings/upload`;
3. HTTP data URIs: 2 concurrent clients, 16 base64 data URIs per `POST /v1/embeddings` (modality image).
Reports the median images/s of each and the ratio to in-process, the CPU seconds spent per image
(server plus client for HTTP; a figure that holds up better than wall time when other work shares
the cores), and how far the server's vectors are from the in-process ones (equal, unless JPEGs
large enough for a reduced decode are sent without `--whole-jpeg`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from lib.datasets import PHOTO, data_file
from lib.serving import free_port, start_server

REPO = Path(__file__).resolve().parents[1]
BATCH = 16
CLIENTS = 2


def build_clip(root: Path) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    sys.path.insert(0, str(REPO))
    from tests.builders.media import clip_tokenizer

    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    text = {"vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 32, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    vision = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 6,
              "image_size": 224, "patch_size": 32}  # fmt: skip
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=256)).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(root)
    return root


def images(count: int, size: tuple[int, int] | None = None) -> list[bytes]:
    """JPEGs from 160 to 640 px wide (or all of `size`): crops and resizes of the real photo."""
    from PIL import Image

    photo = Image.open(data_file(PHOTO)).convert("RGB")
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        w, h = photo.size
        left, top = int(rng.integers(0, w // 3)), int(rng.integers(0, h // 3))
        crop = photo.crop((left, top, left + w // 2 + int(rng.integers(0, w // 2 - left + 1)), h))
        width = int(rng.integers(160, 641))
        shape = size or (width, max(16, width * crop.height // crop.width))
        buffer = io.BytesIO()
        crop.resize(shape, Image.Resampling.BICUBIC).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def batches(items: list[bytes]) -> list[list[bytes]]:
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


class InProcess:
    def __init__(self, root: Path) -> None:
        import torch
        from transformers import CLIPImageProcessor, CLIPModel

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.torch = torch
        self.model = CLIPModel.from_pretrained(root).eval()
        self.processor = CLIPImageProcessor.from_pretrained(root)

    def embed(self, batch: list[bytes]) -> np.ndarray:
        from PIL import Image

        pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in batch]
        with self.torch.inference_mode():
            pixels = self.processor(images=pictures, return_tensors="pt")
            vectors: np.ndarray = self.model.get_image_features(**pixels).pooler_output.numpy()
        return vectors

    def run(self, items: list[bytes]) -> tuple[float, float]:
        """(images/s, CPU seconds per image)."""
        started, cpu = time.perf_counter(), time.process_time()
        for batch in batches(items):
            self.embed(batch)
        return len(items) / (time.perf_counter() - started), (time.process_time() - cpu) / len(items)


def multipart(batch: list[bytes]) -> dict[str, Any]:
    files = [("file", (f"{i}.jpg", b, "image/jpeg")) for i, b in enumerate(batch)]
    return {"url": "/v1/embeddings/upload", "data": {"model": "clip"}, "files": files}


def data_uris(batch: list[bytes]) -> dict[str, Any]:
    uris = [f"data:image/jpeg;base64,{base64.b64encode(b).decode()}" for b in batch]
    return {"url": "/v1/embeddings", "json": {"model": "clip", "input": uris, "modality": "image"}}


async def over_http(base: str, items: list[bytes], shape: Any) -> tuple[float, np.ndarray]:
    """Images/s with CLIENTS concurrent clients sharing the batches, and the vectors in input order."""
    work = list(enumerate(batches(items)))
    results: dict[int, np.ndarray] = {}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=300) as http:
            while work:
                number, batch = work.pop(0)
                response = await http.post(**shape(batch))
                response.raise_for_status()
                results[number] = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    rate = len(items) / (time.perf_counter() - started)
    return rate, np.concatenate([results[i] for i in sorted(results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--size", help="every image WIDTHxHEIGHT pixels, e.g. 4032x3024")
    parser.add_argument("--whole-jpeg", action="store_true", help="serve with scaled_jpeg: false")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.lower().split("x")) if args.size else None
    with tempfile.TemporaryDirectory() as tmp:
        root = build_clip(Path(tmp) / "clip")
        items = images(args.images, size)  # type: ignore[arg-type]
        port = free_port()
        config = {
            "server": {"max_body_bytes": 256 * 2**20, "scaled_jpeg": not args.whole_jpeg},
            "models": [{"name": "clip", "source": str(root), "pin": True}],
        }
        server = start_server(config, Path(tmp), port)
        try:
            report = measure(root, items, f"http://127.0.0.1:{port}", args.rounds, psutil.Process(server.pid))
        finally:
            server.terminate()
            server.wait(30)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def timed_http(server: psutil.Process, base: str, items: list[bytes], shape: Any) -> tuple[float, float, np.ndarray]:
    """(images/s, CPU seconds per image in server and client together, vectors)."""
    before, cpu = server.cpu_times(), time.process_time()
    rate, vectors = asyncio.run(over_http(base, items, shape))
    after = server.cpu_times()
    spent = (after.user - before.user) + (after.system - before.system) + time.process_time() - cpu
    return rate, spent / len(items), vectors


def measure(root: Path, items: list[bytes], base: str, rounds: int, server: psutil.Process) -> dict[str, Any]:
    local = InProcess(root)
    reference = np.concatenate([local.embed(b) for b in batches(items)])
    asyncio.run(over_http(base, items[:BATCH], multipart))  # warm-up
    rates: dict[str, list[float]] = {"in_process": [], "http_multipart": [], "http_data_uri": []}
    cpu: dict[str, list[float]] = {name: [] for name in rates}
    worst, cosine = 0.0, 1.0
    for _ in range(rounds):
        rate, per_image = local.run(items)
        rates["in_process"].append(rate)
        cpu["in_process"].append(per_image)
        for name, shape in (("http_multipart", multipart), ("http_data_uri", data_uris)):
            rate, per_image, vectors = timed_http(server, base, items, shape)
            rates[name].append(rate)
            cpu[name].append(per_image)
            worst = max(worst, float(np.abs(vectors - reference).max()))
            cosine = min(cosine, float(_cosines(vectors, reference).min()))
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "images": len(items),
        "bytes_per_image": int(statistics.mean(len(i) for i in items)),
        "rounds": rounds,
        "images_per_s": {k: round(v, 1) for k, v in median.items()},
        "all_rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "ratio_to_in_process": {k: round(v / median["in_process"], 3) for k, v in median.items() if k != "in_process"},
        "cpu_ms_per_image": {k: round(1000 * statistics.median(v), 1) for k, v in cpu.items()},
        "max_abs_difference_to_in_process": worst,
        "least_cosine_to_in_process": round(cosine, 7),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot: np.ndarray = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return dot


if __name__ == "__main__":
    main()
