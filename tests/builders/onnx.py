"""ONNX graphs shipped beside a model's weights, as hub repositories publish them: the encoder's
`onnx/model.onnx` (its `last_hidden_state`), and quantized variants under the names
sentence-transformers' exports give them (`model_qint8_avx512_vnni.onnx`, ...).

The graphs are exported here with torch, in the full install, so that the install without torch
has something to serve; what it answers is compared with sentence-transformers on the weights.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from model_registry.backends.base import Task


def ship_graph(root: Path, *, quantized: tuple[str, ...] = (), task: Task = "feature-extraction") -> Path:
    """`root/onnx/model.onnx` for `task` (a cross-encoder's: "sequence-classification", its
    logits), and each of `quantized` (file names) as its int8 variant."""
    from model_registry.backends.onnx.build import quantize_int8
    from model_registry.backends.onnx.export import export

    target = root / "onnx"
    target.mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter, as the engine's build ignores it
        export(root, task, target / "model.onnx", trust_remote_code=False)
    for name in quantized:
        quantize_int8(target / "model.onnx", target / name)
    return root
