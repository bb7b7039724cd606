"""Long-document retrieval: truncation, `long_inputs: "chunk"` and `"late"` against each other.

    .venv/bin/python benchmarks/bench_long_inputs.py [--documents 40] [--sentences 24]
        [--queries 4] [--late-length 512] [--device cpu|cuda]

The bundled all-MiniLM-L6-v2 on torch, in process (`Registry`). Each document joins `--sentences`
distinct STS-benchmark sentences (about 15 tokens each, so 24 make ~360 tokens); `--queries` of
them are the first sentence of a pair the benchmark scores 4 or more (of 5), and that pair's other
sentence is a query, a paraphrase of a sentence anywhere in the document. A query is found when
its best document (cosine) is its own: recall@1 and MRR, for documents embedded

- cut at the model's 256 tokens (`truncate: true`), one vector each;
- whole, as pooled windows of 256 tokens (`long_inputs: "chunk"`, how vLLM embeds long inputs),
  one vector each;
- whole in one pass at `--late-length` tokens (MiniLM's position table holds 512), one vector;
- late chunking in that one pass (`long_inputs: "late"`), one vector per sentence, a document
  scored by its best sentence;
- each sentence embedded alone, a document scored by its best sentence (no context at all).

Also prints the recall for queries from each document's first and last quarter, and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any

import numpy as np

from lib.datasets import sts_rows
from lib.engines import SOURCE
from lib.machine import cpu
from model_registry import Registry

#: The benchmark's gold score (0-5) from which a pair's sentences count as paraphrases.
PARAPHRASE = 4.0


def corpus(args: argparse.Namespace) -> tuple[list[list[str]], list[tuple[str, int, float]]]:
    """Documents as their sentences, and queries as (text, its document, its position from 0 to 1)."""
    rows = sts_rows(None)
    pairs = sorted({(a, b) for a, b, score in rows if score >= PARAPHRASE and a != b})
    paired = {s for pair in pairs for s in pair}
    filler = sorted({s for a, b, _ in rows for s in (a, b)} - paired)
    random.Random(0).shuffle(pairs)
    random.Random(1).shuffle(filler)
    rng = random.Random(2)
    used: set[str] = set()
    documents: list[list[str]] = []
    queries = []
    for d in range(args.documents):
        chosen = []
        while len(chosen) < args.queries:
            a, b = pairs.pop()
            if a not in used and b not in used:  # a sentence in two pairs would answer two queries
                used.update((a, b))
                chosen.append((a, b))
        rest = filler[d * (args.sentences - args.queries) : (d + 1) * (args.sentences - args.queries)]
        parts = [a for a, _ in chosen] + rest
        rng.shuffle(parts)
        documents.append(parts)
        for a, b in chosen:
            queries.append((b, d, parts.index(a) / len(parts)))
    return documents, queries


def vectors(results: Any) -> np.ndarray:
    return np.stack([r.dense for r in results.items])


def ranks(scores: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """Each query's rank (1 = first) of its own document, from (queries, documents) scores."""
    own = scores[np.arange(len(owners)), owners]
    return 1 + (scores > own[:, None]).sum(axis=1)


def best_part(queries: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """(queries, documents) scores: each document's best part (rows of `parts[d]`)."""
    return np.stack([(queries @ p.T).max(axis=1) for p in parts], axis=1)


async def measure(args: argparse.Namespace) -> None:
    documents, queries = corpus(args)
    texts = [" ".join(parts) for parts in documents]
    starts = []
    for parts in documents:
        offsets, at = [], 0
        for part in parts:
            offsets.append((at, at + len(part)))
            at += len(part) + 1
        starts.append(offsets)
    model = {"source": SOURCE, "backend": "torch", "device": args.device}
    models = [{"name": "m", **model}, {"name": "long", **model, "max_length": args.late_length}]
    config = {"models": models, "max_chunks_per_request": args.documents * args.sentences}
    async with Registry.from_config(config) as registry:
        asked = vectors(await registry.embed("m", [q for q, _, _ in queries]))
        cut = vectors(await registry.embed("m", texts, truncate=True))
        chunked = await registry.embed("m", texts, truncate=False, long_inputs="chunk")
        whole = vectors(await registry.embed("long", texts, truncate=False))
        late = await registry.embed("long", texts, truncate=False, long_inputs="late", spans=starts)
        alone = vectors(await registry.embed("m", [s for parts in documents for s in parts]))
    owners = np.array([d for _, d, _ in queries])
    where = np.array([p for _, _, p in queries])
    sizes = np.cumsum([0] + [len(parts) for parts in documents])
    methods = {
        "truncate (256)": asked @ cut.T,
        "chunk (256-token windows)": asked @ vectors(chunked).T,
        f"whole, one pass ({args.late_length})": asked @ whole.T,
        f"late, per sentence ({args.late_length})": best_part(asked, [np.asarray(r.multivector) for r in late.items]),
        "sentences alone": best_part(asked, [alone[sizes[d] : sizes[d + 1]] for d in range(len(documents))]),
    }
    print(f"{len(documents)} documents, {len(queries)} queries, {chunked.tokens / len(documents):.0f} tokens each")
    print("| documents embedded | recall@1 | MRR | recall@1, first quarter | last quarter |")
    print("|---|---|---|---|---|")
    for name, scores in methods.items():
        rank = ranks(scores, owners)
        found = rank == 1
        first, last = found[where < 0.25].mean(), found[where >= 0.75].mean()
        print(f"| {name} | {found.mean():.3f} | {(1 / rank).mean():.3f} | {first:.3f} | {last:.3f} |")
    print(cpu())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--late-length", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
