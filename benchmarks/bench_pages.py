"""Documents as pages: a PDF indexed by a page model over HTTP, against the same pipeline in-process.

    .venv/bin/python benchmarks/bench_pages.py [--pages 4] [--rounds 3] [--edge 512] [--json OUT]

The model has ColModernVBert's shapes with random weights (its speed, not its vectors): a 22-layer
768-wide ModernBERT, a 12-layer 768-wide SigLIP tower at `--edge` px with 16 px patches, a pixel
shuffle of 4 (64 tokens per tile), and Idefics3's image processor with tiles of `--edge` px and pages
up to `--edge` px on their longest side (one tile and the global image). The PDF holds `--pages`
pages of the COCO photo of two cats, cropped several ways. In rounds:

1. the server (`infinity-server serve`, the model pinned): the PDF uploaded to
   `/v1/embeddings/upload` with `output=multivector`, one request;
2. the same pages, rendered by the benchmark and uploaded as PNG images: the per-image cost;
3. in-process: PDFium renders each page, the model's processor and forward run on it, one page at
   a time (the naive loop).

Prints pages/s of each per round, the medians and the ratios, and the machine.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lib.datasets import data_file
from lib.machine import cpu
from lib.serving import free_port, start_server


def build(root: Path, edge: int) -> Path:
    """ColModernVBert's shapes, random weights, saved with its processor."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import (
        ColModernVBertConfig,
        ColModernVBertForRetrieval,
        ColModernVBertProcessor,
        Idefics3ImageProcessor,
        ModernBertConfig,
        ModernVBertConfig,
        Qwen2Tokenizer,
        SiglipVisionConfig,
    )

    torch.manual_seed(0)
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer: Any = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, pad_token="<|endoftext|>")  # type: ignore[arg-type]
    tiles = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    marks = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|begin_of_text|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*marks, *tiles]})
    images = Idefics3ImageProcessor(
        size={"longest_edge": edge}, max_image_size={"longest_edge": edge}, do_image_splitting=True
    )
    processor = ColModernVBertProcessor(image_processor=images, tokenizer=tokenizer, image_seq_len=64)
    special = {key: tokenizer.pad_token_id for key in ("bos_token_id", "cls_token_id", "sep_token_id")}
    text = ModernBertConfig(pad_token_id=tokenizer.pad_token_id, **special)
    vision = SiglipVisionConfig(image_size=edge, patch_size=16)
    vlm = ModernVBertConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pixel_shuffle_factor=4,
    )
    ColModernVBertForRetrieval(
        ColModernVBertConfig(vlm_config=vlm.to_dict(), embedding_dim=128)
    ).eval().save_pretrained(root)
    processor.save_pretrained(root)
    return root


def document(pages: int) -> bytes:
    """A PDF of `pages` crops of the photo, one per page, written by Pillow at 72 dpi."""
    from PIL import Image

    photo = Image.open(data_file("cats_coco_sample.jpg")).convert("RGB")
    width, height = photo.size
    crops = [photo.crop((i * width // (2 * pages), 0, width - i * width // (4 * pages), height)) for i in range(pages)]
    buffer = io.BytesIO()
    crops[0].save(buffer, format="PDF", save_all=True, append_images=crops[1:], resolution=72)
    return buffer.getvalue()


def rendered(data: bytes, pixels: int) -> list[bytes]:
    """The pages as the server renders them (`model_registry.media.pages`), as PNG files."""
    import pypdfium2

    out = []
    pdf = pypdfium2.PdfDocument(data)
    for page in pdf:
        width, height = page.get_size()
        picture = page.render(scale=math.sqrt(pixels / (width * height))).to_pil().convert("RGB")
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    pdf.close()
    return out


def upload(client: httpx.Client, files: list[tuple[str, bytes, str]]) -> float:
    parts = [("file", item) for item in files]
    started = time.perf_counter()
    answer = client.post("/v1/embeddings/upload", data={"model": "pages", "output": "multivector"}, files=parts)
    answer.raise_for_status()
    assert len(answer.json()["data"]) == len(files) if files[0][2] != "application/pdf" else True
    return time.perf_counter() - started


def in_process(model: Any, processor: Any, data: bytes, pixels: int) -> float:
    """PDFium, the processor and the forward pass, one page at a time."""
    import pypdfium2
    import torch

    started = time.perf_counter()
    pdf = pypdfium2.PdfDocument(data)
    for page in pdf:
        width, height = page.get_size()
        picture = page.render(scale=math.sqrt(pixels / (width * height))).to_pil().convert("RGB")
        with torch.inference_mode():
            model(**processor.process_images([picture], return_tensors="pt"))
    pdf.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--edge", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from transformers import AutoProcessor, ColModernVBertForRetrieval

    pdf = document(args.pages)
    pixels = args.edge * args.edge
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as work:
        directory = build(Path(work) / "colmodernvbert-shaped", args.edge)
        model = ColModernVBertForRetrieval.from_pretrained(directory).eval()
        processor = AutoProcessor.from_pretrained(directory)
        port = free_port()
        entry = {"name": "pages", "source": str(directory), "pin": True}
        server = start_server({"models": [entry]}, Path(work), port)
        images = [(f"{i}.png", png, "image/png") for i, png in enumerate(rendered(pdf, pixels))]
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900) as client:
                upload(client, [("doc.pdf", pdf, "application/pdf")])  # warm
                in_process(model, processor, pdf, pixels)
                for round_ in range(args.rounds):
                    row = {
                        "round": round_,
                        "pdf_pages_s": args.pages / upload(client, [("doc.pdf", pdf, "application/pdf")]),
                        "images_pages_s": args.pages / upload(client, images),
                        "in_process_pages_s": args.pages / in_process(model, processor, pdf, pixels),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            server.terminate()
            server.wait(30)
    medians = {key: statistics.median(r[key] for r in rows) for key in rows[0] if key != "round"}
    summary = {
        **{key: round(value, 3) for key, value in medians.items()},
        "pdf_over_in_process": round(medians["pdf_pages_s"] / medians["in_process_pages_s"], 3),
        "pdf_over_images": round(medians["pdf_pages_s"] / medians["images_pages_s"], 3),
        "pages": args.pages,
        "edge": args.edge,
        "machine": cpu(),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rows, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
