#!/usr/bin/env bash
# The GPU checks on a GPU machine of this workplace: installs the kit `scripts/gpu-kit` made in
# .gpu/ (carried with the working tree), then runs benchmarks/gpu_run.py with the arguments given.
# Its records land in $OUT/run.json (or gpu-run/run.json), the whole output in log.txt beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/.gpu/minilm:$PWD/src:$PWD" BENCH_DATA_DIR="$PWD/.gpu/data" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
exec python3 benchmarks/gpu_run.py --out "${OUT:-gpu-run}" "$@"
