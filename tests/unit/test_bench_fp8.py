"""benchmarks/bench_fp8.py and the shapes it builds: the Qwen3-Embedding-0.6B shape has the
published model's size, and on a CPU the benchmark says plainly that fp8 needs a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.lib import shapes

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_qwen3_shape_has_the_published_model_s_parameters() -> None:
    """Qwen3-Embedding-0.6B's model card: 0.6B parameters, 0.44B of them outside the embeddings."""
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(shapes.config("qwen3-0.6b"))
    total = sum(p.numel() for p in model.parameters())
    outside = total - model.get_input_embeddings().weight.numel()
    assert (round(total / 1e9, 1), round(outside / 1e9, 2)) == (0.6, 0.44)
    assert shapes.config("qwen3-0.6b", layers=2).num_hidden_layers == 2
    with pytest.raises(ValueError, match=r"unknown shape 'qwen9'; known: qwen3-0\.6b"):
        shapes.config("qwen9")


def test_the_benchmark_on_a_cpu_says_fp8_needs_a_gpu_and_exits_non_zero() -> None:
    script = REPO / "benchmarks" / "bench_fp8.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cpu"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "fp8 needs an NVIDIA GPU of compute capability 8.9 or higher" in done.stderr
    assert "this run is on a CPU (--device cpu)" in done.stderr
