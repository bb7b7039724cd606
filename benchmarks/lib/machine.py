"""What machine a figure was measured on: the CPU's model and vector extensions, the GPU, and how
much of the CPU the hypervisor gave to others.

int8 speed depends on the vector extensions (VNNI, AVX-512, AMX), so every benchmark prints them
with its figures; `lscpu` reads them, with `/proc/cpuinfo` where `lscpu` is missing.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

#: The extensions that move the engines' speed, in the order the reports print them.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def lscpu() -> dict[str, str]:
    """`lscpu`'s fields (name -> value); empty where it is not installed."""
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    return {name.strip(): value.strip() for name, _, value in (line.partition(":") for line in output.splitlines())}


def _cpuinfo(field: str) -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(field)), None)


def cpu_model(default: str = "?") -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor", "AMD EPYC ..."), or `default`."""
    return lscpu().get("Model name") or _cpuinfo("model name") or default


def cpu_flags() -> set[str]:
    """Every CPU flag the kernel reports."""
    return set((lscpu().get("Flags") or _cpuinfo("flags") or "").split())


def vector_flags(wanted: tuple[str, ...] = VECTOR_FLAGS) -> list[str]:
    """The flags of `wanted` this CPU has, in `wanted`'s order."""
    flags = cpu_flags()
    return [flag for flag in wanted if flag in flags]


def cpu() -> str:
    """The CPU's model and its vector extensions: "AMD EPYC (avx2, fma)"."""
    if not lscpu() and _cpuinfo("model name") is None:
        return "unknown"
    return f"{cpu_model()} ({', '.join(vector_flags()) or 'no AVX2'})"


def processor() -> str:
    """The CPU's model where it can be read, else the architecture ("x86_64")."""
    return cpu_model(default="") or platform.processor() or platform.machine()


def gpu() -> str:
    """The first GPU's name and the CUDA version torch was built with."""
    import torch

    return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}, torch {torch.__version__})"


def record_device(device: str) -> str:
    """The machine as `docs/runs/` records name it: the GPU's name on `cuda`, else the CPU's model."""
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(0))
    return str(cpu_model())


def steal() -> tuple[int, int]:
    """(steal, total) CPU ticks since boot (`/proc/stat`): time the hypervisor gave to others."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields)
