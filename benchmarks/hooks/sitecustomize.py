"""Applies `lib/standin.py`'s stand-ins and `lib/profiling.py`'s profile in a server started by a
benchmark, from the environment."""

import os

_NAMES = ("BENCH_STAND_IN", "BENCH_WITHOUT_FREEZE", "BENCH_GC_THRESHOLDS", "BENCH_SWITCH_INTERVAL")

if any(os.environ.get(name) for name in _NAMES):
    from lib import standin

    if os.environ.get("BENCH_STAND_IN"):
        standin.stand_in(
            float(os.environ["BENCH_STAND_IN"]),
            int(os.environ.get("BENCH_STAND_IN_OPS") or 0),
            int(os.environ.get("BENCH_STAND_IN_WIDTH") or 8),
        )
    if os.environ.get("BENCH_WITHOUT_FREEZE"):
        standin.without_freeze()
    if os.environ.get("BENCH_GC_THRESHOLDS"):
        standin.collector_thresholds(os.environ["BENCH_GC_THRESHOLDS"])
    if os.environ.get("BENCH_SWITCH_INTERVAL"):
        standin.switch_interval(float(os.environ["BENCH_SWITCH_INTERVAL"]))

if os.environ.get("BENCH_PROFILE"):
    from pathlib import Path

    from lib import profiling

    profiling.in_server(Path(os.environ["BENCH_PROFILE"]), os.environ.get("BENCH_PROFILE_NAME") or "server")
