"""What NVIDIA GPUs this machine has, from NVML (docs/servers.md), for the budget decision.

:func:`read_gpus` never raises: no NVIDIA driver, no ``libnvidia-ml.so``, a GPU that
fell off the bus, even a broken binding all mean "no GPU", with NVML's own words as the
reason, and the budget becomes a clear CPU decision (``toolforge.core.budget``). A GPU probe
must never be what keeps the gateway from starting.

``nvmlShutdown`` runs after every successful ``nvmlInit``, whatever happens in between:
NVML counts its initialisations, and a leaked one keeps the library loaded. Memory is
NVML's ``nvmlDeviceGetMemoryInfo`` (v1) ``total``/``free`` in bytes; the budget uses the
total (a stable number, docs/servers.md), ``free`` is only reported.

NVML is injectable (``nvml=``): tests pass a fake module; by default ``pynvml`` (the
``nvidia-ml-py`` package) is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolforge.core.budget import GpuDevice, GpuInfo

__all__ = ["GpuProbe", "read_gpus"]


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """The answer of one NVML probe: the GPUs, or ``None`` and why there are none."""

    gpu: GpuInfo | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for ``/v1/servers``."""
        return {
            "gpu": None if self.gpu is None else self.gpu.to_dict(),
            "reason": self.reason,
        }


def _text(value: object) -> str:
    # nvidia-ml-py returns str; pynvml before 11.5 (and some forks) returned bytes.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _query(nvml: Any) -> GpuProbe:
    count = int(nvml.nvmlDeviceGetCount())
    if count < 1:
        return GpuProbe(None, "the driver is loaded but reports no GPU")
    devices = []
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        devices.append(
            GpuDevice(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                total_bytes=int(memory.total),
                free_bytes=int(memory.free),
            )
        )
    gpu = GpuInfo(tuple(devices))
    plural = "GPU" if count == 1 else "GPUs"
    return GpuProbe(gpu, f"NVML sees {count} {plural}: {gpu.name}")


def read_gpus(nvml: Any = None) -> GpuProbe:
    """Every NVIDIA GPU NVML can see, or ``GpuProbe(None, reason)``. Never raises."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py is a dependency, but be total
            return GpuProbe(None, f"the pynvml module is not installed ({exc})")
        nvml = pynvml
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except nvml_error as exc:
        return GpuProbe(None, _text(exc) or type(exc).__name__)
    except Exception as exc:  # e.g. OSError from a broken libnvidia-ml.so
        return GpuProbe(None, f"{type(exc).__name__}: {exc}")
    try:
        return _query(nvml)
    except nvml_error as exc:
        return GpuProbe(None, _text(exc) or type(exc).__name__)
    except Exception as exc:
        return GpuProbe(None, f"{type(exc).__name__}: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # nothing useful to do; the answer is already decided
            pass
