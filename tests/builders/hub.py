"""A Hugging Face hub cache laid out on disk as huggingface_hub writes it (no download)."""

from __future__ import annotations

from pathlib import Path


def lay_out_cache(cache: Path, repo: str, commit: str, branch: str = "main") -> Path:
    """The standard hub cache layout: refs/<branch> holds the commit, snapshots/<commit>/ the files."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (root / "refs").mkdir()
    (root / "refs" / branch).write_text(commit)
    return snapshot
