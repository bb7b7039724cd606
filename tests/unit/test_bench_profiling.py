"""benchmarks/lib/profiling.py: a window profiles exactly its batches, on the thread that runs
them, and writes their operators' table."""

from __future__ import annotations

from pathlib import Path

import torch
from benchmarks.lib.profiling import Window


def test_a_window_profiles_only_its_batches_and_writes_their_operators(tmp_path: Path) -> None:
    window = Window(tmp_path, "in-process-torch-short", skip=2, count=3)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    for i in range(7):
        window.around(lambda: torch.mm(a, b)) if i in (2, 3, 4) else window.around(lambda: torch.add(a, b))
    text = (tmp_path / "in-process-torch-short.txt").read_text()
    assert text.startswith("3 batches after 2, ")
    table = text.split("by self_cpu_time_total:")[1]
    assert "aten::mm" in table
    assert "aten::add " not in table  # batches outside the window are not in it
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("aten::mm")]
    assert rows[0][-1] == "3"  # calls
