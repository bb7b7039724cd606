"""Long-document retrieval: `long_inputs: "chunk"` against truncation at the model's length.

    .venv/bin/python benchmarks/bench_long_inputs.py [--documents 40] [--sentences 24]
        [--queries 4] [--device cpu|cuda]

The bundled all-MiniLM-L6-v2 (256 tokens) on torch, in process (`Registry`). Each document joins
`--sentences` distinct STS-benchmark sentences (about 15 tokens each, so 24 make ~360 tokens);
its queries are `--queries` of its own sentences drawn anywhere in it. A query is found when its
nearest document (cosine) is its own: recall@1 over all queries, for documents embedded cut at
256 tokens (`truncate: true`) and whole (`truncate: false, long_inputs: "chunk"`). Prints the
recall of each, also for queries from each document's first and last quarter, the windows per
document, and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any

import numpy as np

from lib.datasets import sts_sentences
from lib.engines import SOURCE
from lib.machine import cpu
from model_registry import Registry


def corpus(args: argparse.Namespace) -> tuple[list[str], list[tuple[str, int, float]]]:
    """Documents, and queries as (sentence, its document, its position in it from 0 to 1)."""
    sentences = sts_sentences()
    random.Random(0).shuffle(sentences)
    rng = random.Random(1)
    documents, queries = [], []
    for d in range(args.documents):
        parts = sentences[d * args.sentences : (d + 1) * args.sentences]
        documents.append(" ".join(parts))
        for k in rng.sample(range(len(parts)), args.queries):
            queries.append((parts[k], d, k / len(parts)))
    return documents, queries


def vectors(results: Any) -> np.ndarray:
    return np.stack([r.dense for r in results.items])


def recall(documents: np.ndarray, queries: np.ndarray, owners: np.ndarray, keep: np.ndarray) -> float:
    nearest = (queries @ documents.T).argmax(axis=1)
    return float((nearest == owners)[keep].mean())


async def measure(args: argparse.Namespace) -> None:
    documents, queries = corpus(args)
    config = {"models": [{"name": "m", "source": SOURCE, "backend": "torch", "device": args.device}]}
    async with Registry.from_config(config) as registry:
        asked = vectors(await registry.embed("m", [q for q, _, _ in queries]))
        cut = vectors(await registry.embed("m", documents, truncate=True))
        whole = await registry.embed("m", documents, truncate=False, long_inputs="chunk")
    owners = np.array([d for _, d, _ in queries])
    where = np.array([p for _, _, p in queries])
    print(f"{len(documents)} documents, {len(queries)} queries, {whole.tokens / len(documents):.0f} tokens each")
    for name, docs in (("truncate", cut), ("chunk", vectors(whole))):
        parts = {"all": where >= 0, "first quarter": where < 0.25, "last quarter": where >= 0.75}
        found = ", ".join(f"{k} {recall(docs, asked, owners, v):.3f}" for k, v in parts.items())
        print(f"{name}: recall@1 {found}")
    print(cpu())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
