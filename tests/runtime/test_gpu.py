"""The NVML probe (docs/servers.md) against a fake NVML: one GPU, two, and every way NVML fails.
It never raises, and ``nvmlShutdown`` follows every successful ``nvmlInit``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml
import pytest

from toolforge.core.budget import GB, decide
from toolforge.runtime.gpu import GpuProbe, read_gpus


class FakeNVMLError(Exception):
    """Stands in for ``pynvml.NVMLError``: its str() is NVML's message."""


@dataclass
class Memory:
    total: int
    free: int
    used: int = 0


@dataclass
class FakeNVML:
    """A module-like NVML. ``fail`` names the call that raises, ``error`` what it raises."""

    cards: list[tuple[str | bytes, int, int]] = field(default_factory=list)
    fail: str | None = None
    error: BaseException = field(default_factory=lambda: FakeNVMLError("Driver Not Loaded"))
    calls: list[str] = field(default_factory=list)
    NVMLError: type[Exception] = FakeNVMLError

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail == name:
            raise self.error

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        self._call("nvmlDeviceGetName")
        return self.cards[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        self._call("nvmlDeviceGetMemoryInfo")
        _, total, free = self.cards[handle]
        return Memory(total=total, free=free, used=total - free)


H100 = ("NVIDIA H100 80GB HBM3", 85_520_809_984, 84_000_000_000)
A5000 = ("NVIDIA RTX A5000", 25_757_220_864, 25_000_000_000)


def test_one_gpu() -> None:
    nvml = FakeNVML(cards=[H100])
    probe = read_gpus(nvml)
    assert probe.gpu is not None
    assert (probe.gpu.count, probe.gpu.name) == (1, "NVIDIA H100 80GB HBM3")
    assert (probe.gpu.total_bytes, probe.gpu.free_bytes) == (H100[1], H100[2])
    assert probe.reason == "NVML sees 1 GPU: NVIDIA H100 80GB HBM3"
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert decide("full", gpu=probe.gpu).budget_tokens == 262_144


def test_two_gpus_are_summed() -> None:
    probe = read_gpus(FakeNVML(cards=[A5000, A5000]))
    assert probe.gpu is not None
    assert [d.index for d in probe.gpu.devices] == [0, 1]
    assert probe.gpu.total_bytes == 2 * A5000[1]
    assert probe.reason == "NVML sees 2 GPUs: 2 × NVIDIA RTX A5000"
    # Each card alone is the 24-48 GB tier; together they are ≥ 48 GB.
    assert decide("full", gpu=probe.gpu).budget_tokens == 262_144


def test_old_bindings_return_bytes_names() -> None:
    probe = read_gpus(FakeNVML(cards=[(b"Tesla T4", 15 * GB, 14 * GB)]))
    assert probe.gpu is not None and probe.gpu.name == "Tesla T4"


@pytest.mark.parametrize(
    ("fail", "message", "shutdown"),
    [
        ("nvmlInit", "Driver Not Loaded", False),  # never initialised: nothing to shut
        ("nvmlInit", "NVML Shared Library Not Found", False),
        ("nvmlDeviceGetCount", "Unknown Error", True),
        ("nvmlDeviceGetHandleByIndex", "GPU is lost", True),
        ("nvmlDeviceGetMemoryInfo", "Insufficient Permissions", True),
        ("nvmlDeviceGetName", "Not Supported", True),
    ],
)
def test_nvml_errors_mean_no_gpu_with_nvmls_words(fail: str, message: str, shutdown: bool) -> None:
    nvml = FakeNVML(cards=[H100], fail=fail, error=FakeNVMLError(message))
    probe = read_gpus(nvml)
    assert probe == GpuProbe(None, message)
    assert ("nvmlShutdown" in nvml.calls) is shutdown
    decision = decide("full", gpu=probe.gpu, no_gpu_reason=probe.reason)
    assert decision.device == "cpu"
    assert f"no NVIDIA GPU found (NVML: {message})" in decision.reason


def test_no_devices_is_no_gpu() -> None:
    nvml = FakeNVML(cards=[])
    assert read_gpus(nvml) == GpuProbe(None, "the driver is loaded but reports no GPU")
    assert nvml.calls[-1] == "nvmlShutdown"


def test_anything_else_is_no_gpu_too() -> None:
    nvml = FakeNVML(cards=[H100], fail="nvmlDeviceGetMemoryInfo", error=OSError("bad .so"))
    assert read_gpus(nvml) == GpuProbe(None, "OSError: bad .so")
    assert nvml.calls[-1] == "nvmlShutdown"
    init = FakeNVML(fail="nvmlInit", error=OSError("undefined symbol"))
    assert read_gpus(init) == GpuProbe(None, "OSError: undefined symbol")


def test_a_failing_shutdown_does_not_change_the_answer() -> None:
    nvml = FakeNVML(cards=[H100], fail="nvmlShutdown", error=FakeNVMLError("Uninitialized"))
    probe = read_gpus(nvml)
    assert probe.gpu is not None and probe.gpu.total_bytes == H100[1]


def test_the_real_binding_never_raises() -> None:
    # On a machine without the NVIDIA driver (CI) this is the CPU path; with one, a GPU.
    probe = read_gpus()
    assert isinstance(probe, GpuProbe) and probe.reason
    assert (probe.gpu is None) or probe.gpu.total_bytes > 0


def test_real_nvml_error_messages_are_used_as_reasons() -> None:
    # The real exception classes: their str() is what the CPU decision quotes.
    nvml = FakeNVML(
        cards=[H100],
        fail="nvmlInit",
        error=pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    )
    nvml.NVMLError = pynvml.NVMLError
    assert read_gpus(nvml).reason == "Driver Not Loaded"


def test_probe_to_dict() -> None:
    probe = read_gpus(FakeNVML(cards=[H100]))
    out = probe.to_dict()
    assert out["reason"] == probe.reason
    assert isinstance(out["gpu"], dict) and out["gpu"]["count"] == 1
    assert GpuProbe(None, "x").to_dict() == {"gpu": None, "reason": "x"}
