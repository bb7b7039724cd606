"""The GPU checks of the torch engine in one run, their figures as one `docs/runs/` file.

    bash benchmarks/gpu_run.sh [--steps tests,packed,fp8,graphs,short,long,profile] [--out DIR]

On a machine with an NVIDIA GPU (`gpu_run.sh` installs the kit `scripts/gpu-kit` builds, then
runs this). Each step runs as its own process under its own time limit, and a step that fails
or runs out of time is recorded as such while the others go on:

- `tests`: every `gpu`-marked test (padding-free parity in float16, CUDA graphs equal eager, the
  fp8 quality gates, the engines' CUDA cells);
- `packed`: padding-free against padded batches on a decoder of Qwen3-Embedding-0.6B's shapes,
  mixed lengths of 16-512 tokens (`bench_packed.py`);
- `fp8`: fp8 against float16 on the same decoder (`bench_fp8.py`);
- `graphs`: an idle query's p50 with CUDA graphs against the eager forward (`bench_graphs.py`);
- `short`, `long`: the server over HTTP against the same engine in-process, torch, 16 clients of
  256 sentences or 64 documents of about 250 tokens (`bench_batches.py`);
- `profile` (only when named): ten batches of the `short` workload profiled with torch.profiler in
  the server and in-process (`bench_batches.py --profile`), the two tables as
  `DIR/server-torch-short-*.txt` and `DIR/in-process-torch-short.txt`: where the server's batches
  lose time against the engine's own. Its throughput is not recorded (the profiler slows both).

Every JSON record a step prints (a line holding `comparison` or `server_per_in_process`) is kept,
with the card, the date and the step's command, in `DIR/run.json`, and the whole output in
`DIR/log.txt`: copy `run.json` to `docs/runs/<date>-<card>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
CUDA = ["--device", "cuda"]
DECODER = ["--shape", "qwen3-0.6b"]
#: Stands for the run's output directory in a step's command.
OUT = "{out}"
PROFILED = ["--engines", "torch", "--clients", "16", "--requests", "32"]

#: step -> (command, seconds it may take).
STEPS: dict[str, tuple[list[str], int]] = {
    "tests": ([PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-W", "error"], 240),
    "packed": ([PY, str(HERE / "bench_packed.py"), *CUDA, *DECODER], 120),
    "fp8": ([PY, str(HERE / "bench_fp8.py"), *CUDA, *DECODER], 120),
    "graphs": ([PY, str(HERE / "bench_graphs.py"), *CUDA], 120),
    "short": ([PY, str(HERE / "bench_batches.py"), *CUDA, "--engines", "torch", "--clients", "16"], 150),
    "long": (
        [PY, str(HERE / "bench_batches.py"), *CUDA, "--engines", "torch", "--clients", "16", "--workload", "long"],
        150,
    ),
    "profile": (
        [PY, str(HERE / "bench_batches.py"), *CUDA, *PROFILED, "--profile", OUT],
        150,
    ),
}
#: The steps a run takes unless told: profiling is asked for.
DEFAULT_STEPS = ("tests", "packed", "fp8", "graphs", "short", "long")
_MARKED = re.compile(r"pytest\.mark\.gpu\b")


def gpu_test_files() -> list[str]:
    """The test files with a `gpu` mark: collecting only these keeps the clients' packages (not on
    the GPU machine) out of the run."""
    return sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if _MARKED.search(p.read_text())
    )


def records(output: str) -> list[dict[str, Any]]:
    """The JSON records among a step's output lines."""
    found = []
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and ("comparison" in value or "server_per_in_process" in value):
            found.append(value)
    return found


def test_counts(output: str) -> dict[str, int]:
    """pytest's summary line as counts: {"passed": 24, "skipped": 2}."""
    return {word: int(count) for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", output)}


def run_step(name: str, log: Any, out: Path) -> tuple[list[str], int | None, str, float]:
    """The step's command, its exit status (None: out of time), output and seconds."""
    command, limit = STEPS[name]
    command = [str(out.resolve()) if part == OUT else part for part in command]
    command = command + gpu_test_files() if name == "tests" else command
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=limit, check=False)
        status: int | None = done.returncode
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        status = None
        output = _text(stopped.stdout) + _text(stopped.stderr)
    seconds = time.perf_counter() - started
    log.write(f"\n=== {name}: {' '.join(command)}\n{output}\n=== {name}: status {status}, {seconds:.0f} s\n")
    log.flush()
    return command, status, output, seconds


def _text(value: bytes | str | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def card() -> str:
    import torch

    return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "no GPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS))
    parser.add_argument("--out", type=Path, default=Path("gpu-run"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = {"card": card(), "date": datetime.date.today().isoformat()}
    kept: list[dict[str, Any]] = []
    with (args.out / "log.txt").open("w") as log:
        for name in args.steps.split(","):
            command, status, output, seconds = run_step(name, log, args.out)
            shown = " ".join(Path(part).name if part.startswith("/") else part for part in command)
            common = {**stamp, "command": shown, "step": name}
            if name == "tests":
                kept.append({**common, "check": "gpu tests", **test_counts(output), "status": status})
            found = [] if name == "profile" else records(output)
            kept += [{**common, **record} for record in found]
            if status != 0 and name != "tests":
                kept.append({**common, "check": name, "status": status, "tail": output[-800:]})
            print(f"{name}: status {status}, {seconds:.0f} s, {len(found)} record(s)", flush=True)
            (args.out / "run.json").write_text(json.dumps(kept, indent=1))
    print(json.dumps(kept, indent=1))


if __name__ == "__main__":
    main()
