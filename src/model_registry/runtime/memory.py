"""Device memory: how much there is, how much a model takes, and giving it back.

CPU figures come from psutil (available RAM); CUDA figures from `torch.cuda.mem_get_info` and
torch's allocator, with torch imported only when a CUDA device is asked about. Nothing here decides what to evict; that
policy lives in `lifecycle.py`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass
from functools import cache
from typing import Any

import psutil

from model_registry.adapters.base import Adapter, LoadOptions
from model_registry.backends import devices
from model_registry.config import parse_budget
from model_registry.errors import ModelUnavailable
from model_registry.runtime import heap
from model_registry.types import Item

log = logging.getLogger(__name__)

_PICKLED = (".bin", ".pt", ".pth")


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What a device has right now, in bytes."""

    total: int
    free: int


def probe(device: str) -> DeviceMemory:
    """Total and free memory of `device` ('cpu' means the machine's available RAM)."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return DeviceMemory(total=int(total), free=int(free))
    ram = psutil.virtual_memory()
    return DeviceMemory(total=int(ram.available), free=int(ram.available))


def device_budget(budget: str | int, device: str) -> int:
    """The budget in bytes for `device`: a byte count as given, a percentage of its memory.

    On CPU the percentage is of the RAM available when asked (the process's own models included
    at that moment), so a registry should ask once, before it loads anything.
    """
    return parse_budget(budget, total=probe(device).total)


def process_rss() -> int:
    return int(psutil.Process().memory_info().rss)


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    return library if hasattr(library, "malloc_trim") else None


def release(device: str) -> None:
    """Give freed memory back to the system: collect cycles (the frozen heap's too, see `heap`),
    trim glibc's heap, empty CUDA's cache.

    Without the trim, glibc keeps freed arenas mapped and RSS stays at its peak after an unload.
    """
    heap.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def worst_case_items(adapter: Adapter, max_batch_tokens: int) -> list[Item]:
    """The first worst-case batch of `adapter` (see `warmup.worst_case_batches`)."""
    from model_registry.runtime.warmup import worst_case_batches

    batches = worst_case_batches(adapter, max_batch_tokens)
    return batches[0] if batches else []


@dataclass(frozen=True, slots=True)
class CudaReading:
    """One CUDA device at one moment, in bytes: what torch's allocator holds for tensors
    (`allocated`) and has reserved from the driver (`reserved`), and what the whole device has in
    use (`used`: total minus free, every allocator and process included)."""

    allocated: int
    reserved: int
    used: int
    #: Bytes reserved in private pools (CUDA graphs') that no tensor holds: torch lends them to
    #: nothing else, so they are as taken as allocated memory.
    pooled: int = 0

    @classmethod
    def take(cls, device: str) -> CudaReading:
        import torch

        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(torch.device(device))
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        return cls(int(allocated), int(reserved), int(total - free), _pooled(torch.device(device)))


def _pooled(device: Any) -> int:
    """The free bytes of the private pools' segments on `device` (the default pool is (0, 0))."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    segments: list[dict[str, Any]] = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call]
    free = 0
    for segment in segments:
        if segment.get("device") == index and tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            free += int(segment.get("total_size", 0)) - int(segment.get("allocated_size", 0))
    return free


def cuda_footprint(before: CudaReading, after: CudaReading, torch_peak: int) -> int:
    """The bytes a load and its warm-up took on a CUDA device: torch's peak of live tensors over
    them, plus whatever the device lost outside torch's allocator (an ONNX Runtime or CTranslate2
    arena, their cuBLAS and cuDNN workspaces), which torch's figures never see.

    The part outside torch is the growth of the device's used memory less the growth of torch's
    reserve, so torch's cache is not counted twice. It is measured after the warm-up, whose peak
    those arenas keep. The free part of private pools (CUDA graphs' memory between replays) is
    charged too: torch's cache lends it to no other tensor. Another process allocating on the same
    device at the same time would be charged here too; a load is over-charged then, never
    under-charged.
    """
    in_torch = max(0, torch_peak - before.allocated)
    outside = (after.used - before.used) - (after.reserved - before.reserved)
    return in_torch + max(0, outside) + max(0, after.pooled - before.pooled)


#: How ONNX Runtime's CUDA arena and CTranslate2 say that the device is full (torch has its own type).
_OUT_OF_MEMORY = ("out of memory", "failed to allocate memory")


def out_of_memory(error: BaseException) -> bool:
    """True when `error` says a CUDA device ran out of memory, whichever engine raised it."""
    import torch

    return isinstance(error, torch.cuda.OutOfMemoryError) or any(s in str(error).lower() for s in _OUT_OF_MEMORY)


def load_and_measure(adapter: Adapter, options: LoadOptions, device: str) -> int:
    """Load `adapter` onto `device` and return its footprint in bytes.

    On CUDA: the allocator's growth over the load plus the peak of a warm-up forward on a
    worst-case batch of every input kind the model takes, and the device memory the load took
    outside torch's allocator (`cuda_footprint`), measured while no other model runs a batch on
    the device, so that a model too large for its batch budget fails here, at load, rather than
    under traffic. Elsewhere: the adapter's own estimate (weights plus working memory).

    The adapter's `build` (an ONNX export, a CTranslate2 conversion: minutes, on the CPU) runs
    first, outside the device's gate: only the part that puts memory on the device keeps the
    device's other models waiting.
    """
    adapter.build(options)
    if not device.startswith("cuda"):
        adapter.load(options)
        return adapter.footprint()
    import torch

    from model_registry.runtime.warmup import run_batches, worst_case_batches

    with devices.gate(device).exclusive():
        before = CudaReading.take(device)
        adapter.load(options)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            ran = run_batches(adapter, worst_case_batches(adapter, options.max_batch_tokens))
        except Exception as error:
            if not out_of_memory(error):
                raise
            adapter.unload()
            release(device)
            raise ModelUnavailable(
                f"the model ran out of {device} memory on a worst-case batch of {options.max_batch_tokens} tokens; "
                "lower its max_batch_tokens or free memory"
            ) from None
        if not ran:
            log.warning("no warm-up for %s; using its estimated footprint", type(adapter).__name__)
            return adapter.footprint()
        after = CudaReading.take(device)
        return cuda_footprint(before, after, torch.cuda.max_memory_allocated(device))


def format_bytes(count: int | float) -> str:
    """1536 -> '1.5 KiB'; for messages that people read."""
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
