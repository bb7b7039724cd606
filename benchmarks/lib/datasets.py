"""The real data the benchmarks (and the tests) run on, found in one place.

The files live in a `shared/data` folder beside the checkout (`../shared/data` from the repository
root), or in the folder that `BENCH_DATA_DIR` names. A missing file is an error that says where
to get it.
"""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

#: The environment variable that points at the data folder, when it is not beside the checkout.
DATA_ENV = "BENCH_DATA_DIR"
REPO = Path(__file__).resolve().parents[2]
#: Where each file comes from, for the error that a missing one raises.
SOURCES = {
    "stsbenchmark.tsv.gz": "https://sbert.net/datasets/stsbenchmark.tsv.gz",
    "cats_coco_sample.jpg": "https://github.com/michaelfeil/infinity/raw/06fd1f4d8f0a869f4482fc1c78b62a75ccbb66a1/docs/assets/cats_coco_sample.jpg",
}
STS = "stsbenchmark.tsv.gz"
PHOTO = "cats_coco_sample.jpg"


class MissingDataError(FileNotFoundError):
    """A data file (or the data folder) is not where the benchmarks look for it."""


def data_dir() -> Path:
    """The data folder: `BENCH_DATA_DIR`, else `shared/data` beside the checkout."""
    configured = os.environ.get(DATA_ENV)
    return Path(configured) if configured else REPO.parent / "shared" / "data"


def data_file(name: str) -> Path:
    """The path of data file `name`, or `MissingDataError` saying where to get it."""
    path = data_dir() / name
    if not path.is_file():
        source = SOURCES.get(name, "the project's shared data")
        raise MissingDataError(
            f"{name} is not in {path.parent}: download it from {source} into that folder, "
            f"or set {DATA_ENV} to the folder that holds it"
        )
    return path


def read_sts(path: Path, split: str | None = "test") -> list[tuple[str, str, float]]:
    """STS-benchmark rows (sentence1, sentence2, gold score) of one split (`None`: every split)."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        for line in handle:
            record = dict(zip(header, line.rstrip("\n").split("\t"), strict=False))
            if split is None or record.get("split") == split:
                rows.append((record["sentence1"], record["sentence2"], float(record["score"])))
    return rows


def sts_rows(split: str | None = "test") -> list[tuple[str, str, float]]:
    """The STS-benchmark rows of one split, from the data folder."""
    return read_sts(data_file(STS), split)


def sts_sentences() -> list[str]:
    """Every distinct STS-benchmark sentence of every split, sorted (about 15 tokens each)."""
    return sorted({sentence for a, b, _ in sts_rows(None) for sentence in (a, b)})


def long_documents(short: list[str], count: int, rng: random.Random) -> list[str]:
    """Documents of about 250 tokens (~1,100 characters) made of consecutive STS sentences."""
    documents = []
    for _ in range(count):
        start = rng.randrange(len(short))
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < 1100:
            parts.append(short[(start + len(parts)) % len(short)])
        documents.append(" ".join(parts))
    return documents
