"""Context budget decisions (docs/servers.md): how many tokens of context each stream may use.

Theory of operation
-------------------
:func:`decide` is a pure function from facts to one :class:`BudgetDecision`. The facts are
gathered elsewhere (NVML by ``toolforge.runtime.gpu``, llama-server's ``/props`` by the server
manager); the decision is reported whole in ``/v1/servers``, ``stream.begin`` and
``metrics.json``, and logged once, so nobody has to guess why a stream got 4,096 tokens.

Modes (``BudgetMode``):

* ``backend`` — trust the server. ``server_n_ctx`` is llama-server's ``/props``
  ``default_generation_settings.n_ctx``, which is already *per slot* (llama-server caps it
  at the model's trained context). We pass no ``--ctx-size`` (``n_ctx`` is ``None``). When
  the server reports nothing usable, the budget falls back to what ``full`` would choose,
  and the reason says so.
* ``manual`` — the configured ``manual_tokens``. Missing, not an integer, or below
  :data:`MIN_BUDGET_TOKENS` is a configuration error (``RequestError(BAD_REQUEST)``).
* ``full`` — the VRAM tier of the GPUs' *total* memory (docs/servers.md):
  < 24 GB → 4,096 tokens, 24-48 GB → 32,768, ≥ 48 GB → 262,144. No GPU → ``cpu_tokens``
  (default 4,096: the smallest GPU tier; a CPU decodes a long prompt slowly anyway).
* ``fast`` — half of ``full`` (shorter attention, faster tokens).

Whatever the mode, the budget is then clamped to ``model_ctx_train`` when it is known:
tokens past the trained context are noise, and llama-server caps each slot there too.

Units: tiers are **decimal gigabytes** (10⁹ bytes), as docs/servers.md writes "GB". This is
deliberate: a card sold as "24 GB" has 24 GiB of memory of which NVML's ``total`` omits the
driver's reservation (an RTX 4090 reports 24,564 MiB ≈ 25.76 × 10⁹ bytes). Against GiB
thresholds that card would fall to the < 24 tier, and a "48 GB" RTX A6000 (49,140 MiB) to
the 24-48 tier; against decimal GB both land where their label says.

Several GPUs: their memory is summed. llama-server's default ``--split-mode layer`` spreads
layers *and* their KV cache over every visible GPU, so the KV cache can use all of it.

KV cache type: ``q8_0`` on a GPU (it halves the KV cache's VRAM against ``f16`` at a
quality cost that is hard to measure — a common choice for the same reason; quantised V
needs flash attention, so :meth:`BudgetDecision.server_args` turns it on). ``f16``
(llama-server's default) on a CPU: the CPU budget is small, RAM is not the scarce
resource, and quantising and dequantising every KV entry costs CPU time per token.

Slots: llama-server divides ``--ctx-size`` evenly between its ``--parallel`` slots when
the slot count is explicit (``--kv-unified`` is only on by default when it is "auto"), so
the server is started with ``n_ctx = budget_tokens × parallel`` and every slot — every
concurrent stream — gets the whole budget.

This module is sans-IO (``app/core``): stdlib only, no logging, clock or OS access.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, assert_never

from toolforge.errors import ErrorCode, RequestError

__all__ = [
    "CPU_FULL_TOKENS",
    "CPU_KV_CACHE_TYPE",
    "GB",
    "GPU_KV_CACHE_TYPE",
    "MIN_BUDGET_TOKENS",
    "VRAM_TIERS",
    "BudgetDecision",
    "BudgetMode",
    "Device",
    "GpuDevice",
    "GpuInfo",
    "decide",
    "tier_tokens",
]

GB: Final = 1_000_000_000
"""A decimal gigabyte, the unit of the VRAM tiers (see the module docstring)."""

VRAM_TIERS: Final[tuple[tuple[int, int], ...]] = (
    (48 * GB, 262_144),
    (24 * GB, 32_768),
    (0, 4_096),
)
"""``(minimum total VRAM in bytes, budget tokens)``, largest first (docs/servers.md)."""

_TIER_LABELS: Final = {262_144: "≥ 48 GB", 32_768: "24-48 GB", 4_096: "< 24 GB"}

CPU_FULL_TOKENS: Final = 4_096
"""The ``full`` budget with no GPU: the smallest GPU tier, a prompt a CPU still reads in
seconds with a small model."""

MIN_BUDGET_TOKENS: Final = 512
"""The smallest budget we accept from configuration: below it the system prompt
(``prompts/system.txt``, ~220 tokens) and one tool's spec leave no room for a reply."""

GPU_KV_CACHE_TYPE: Final = "q8_0"
"""KV cache type on a GPU: half the VRAM of ``f16`` for a negligible quality loss."""

CPU_KV_CACHE_TYPE: Final = "f16"
"""KV cache type on a CPU: llama-server's default; nothing to save, no dequantising."""

Device = Literal["gpu", "cpu"]


def _gb(n_bytes: int) -> str:
    # Truncated, not rounded: 47.99 GB must not read "48.0 GB" in the 24-48 GB tier.
    return f"{n_bytes // (GB // 10) / 10:.1f} GB"


class BudgetMode(StrEnum):
    """How the context budget is chosen (docs/servers.md)."""

    BACKEND = "backend"
    MANUAL = "manual"
    FULL = "full"
    FAST = "fast"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One NVIDIA GPU as NVML reports it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for ``/v1/servers``."""
        return {
            "index": self.index,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
        }


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Every GPU NVML sees (at least one). Totals are sums: see the module docstring."""

    devices: tuple[GpuDevice, ...]

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("GpuInfo needs at least one device; no GPU is None")

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def free_bytes(self) -> int:
        return sum(d.free_bytes for d in self.devices)

    @property
    def name(self) -> str:
        """``"NVIDIA H100"``, ``"2 × NVIDIA RTX A6000"`` or, for mixed cards, a list."""
        names = [d.name for d in self.devices]
        if len(set(names)) == 1:
            return names[0] if len(names) == 1 else f"{len(names)} × {names[0]}"
        return " + ".join(names)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for ``/v1/servers``."""
        return {
            "name": self.name,
            "count": self.count,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "devices": [d.to_dict() for d in self.devices],
        }


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    """One context-budget decision, with the sentence that explains it.

    ``budget_tokens`` is per slot, that is per concurrent stream. ``n_ctx`` is the
    ``--ctx-size`` to start llama-server with (``budget_tokens × parallel``), or ``None``
    in ``backend`` mode, where the server chooses and we read its choice back.
    """

    mode: BudgetMode
    budget_tokens: int
    device: Device
    gpu_name: str | None
    gpu_count: int
    vram_total_bytes: int | None
    kv_cache_type: str
    parallel: int
    n_ctx: int | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for ``/v1/servers``, ``stream.begin`` and ``metrics.json``."""
        return {
            "mode": str(self.mode),
            "budget_tokens": self.budget_tokens,
            "device": self.device,
            "gpu_name": self.gpu_name,
            "gpu_count": self.gpu_count,
            "vram_total_bytes": self.vram_total_bytes,
            "kv_cache_type": self.kv_cache_type,
            "parallel": self.parallel,
            "n_ctx": self.n_ctx,
            "reason": self.reason,
        }

    def server_args(self) -> tuple[str, ...]:
        """llama-server flags that carry out this decision.

        ``--flash-attn on`` comes with a quantised KV cache because llama.cpp refuses a
        quantised V cache without flash attention ("quantized V cache was requested, but
        this requires Flash Attention", src/llama-context.cpp).
        """
        args: list[str] = []
        if self.n_ctx is not None:
            args += ["--ctx-size", str(self.n_ctx)]
        args += ["--parallel", str(self.parallel)]
        args += ["--cache-type-k", self.kv_cache_type, "--cache-type-v", self.kv_cache_type]
        if self.kv_cache_type != CPU_KV_CACHE_TYPE:
            args += ["--flash-attn", "on"]
        return tuple(args)


def tier_tokens(vram_bytes: int) -> int:
    """The seed's VRAM tier for ``vram_bytes`` of total VRAM (decimal GB thresholds)."""
    for floor, tokens in VRAM_TIERS:
        if vram_bytes >= floor:
            return tokens
    return VRAM_TIERS[-1][1]  # negative input: the smallest tier, never an error


def _config_error(message: str) -> RequestError:
    return RequestError(ErrorCode.BAD_REQUEST, message)


def _full(gpu: GpuInfo | None, no_gpu_reason: str, cpu_tokens: int) -> tuple[int, str]:
    if gpu is None:
        return cpu_tokens, (
            f"no NVIDIA GPU found (NVML: {no_gpu_reason}): CPU decision, "
            f"{cpu_tokens:,} tokens for full"
        )
    tokens = tier_tokens(gpu.total_bytes)
    return tokens, (
        f"{_gb(gpu.total_bytes)} of VRAM on {gpu.name} is in the {_TIER_LABELS[tokens]} "
        f"tier: {tokens:,} tokens for full"
    )


def decide(
    mode: BudgetMode | str,
    *,
    gpu: GpuInfo | None,
    no_gpu_reason: str = "not queried",
    server_n_ctx: int | None = None,
    manual_tokens: int | None = None,
    parallel: int = 1,
    cpu_tokens: int = CPU_FULL_TOKENS,
    model_ctx_train: int | None = None,
) -> BudgetDecision:
    """Choose the context budget for ``mode`` from the facts given.

    ``gpu`` is ``None`` when NVML found no GPU, and ``no_gpu_reason`` then says why
    (NVML's own words). ``server_n_ctx`` is llama-server's per-slot ``/props`` n_ctx,
    ``model_ctx_train`` the model's trained context (``/v1/models`` ``meta.n_ctx_train``).
    Raises :class:`~toolforge.errors.RequestError` (``BAD_REQUEST``) on a bad configuration:
    an unknown mode, ``manual`` without a usable ``manual_tokens``, ``parallel < 1`` or a
    ``cpu_tokens`` below :data:`MIN_BUDGET_TOKENS`. Never raises for missing hardware.
    """
    try:
        mode = BudgetMode(mode)
    except ValueError:
        choices = ", ".join(m.value for m in BudgetMode)
        raise _config_error(f"unknown budget mode {mode!r}: use one of {choices}") from None
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise _config_error(f"parallel slots must be an integer ≥ 1, got {parallel!r}")
    if isinstance(cpu_tokens, bool) or not isinstance(cpu_tokens, int):
        raise _config_error(f"the CPU budget must be an integer, got {cpu_tokens!r}")
    if cpu_tokens < MIN_BUDGET_TOKENS:
        raise _config_error(
            f"the CPU budget must be at least {MIN_BUDGET_TOKENS:,} tokens, got {cpu_tokens:,}"
        )

    n_ctx_from_budget = True
    match mode:
        case BudgetMode.FULL:
            budget, why = _full(gpu, no_gpu_reason, cpu_tokens)
            reason = f"full: {why}"
        case BudgetMode.FAST:
            full, why = _full(gpu, no_gpu_reason, cpu_tokens)
            budget = full // 2
            reason = f"fast: {why}; fast is half: {budget:,} tokens"
        case BudgetMode.MANUAL:
            if manual_tokens is None:
                raise _config_error(
                    "budget mode manual needs a token count; set one or choose "
                    "backend, full or fast"
                )
            if isinstance(manual_tokens, bool) or not isinstance(manual_tokens, int):
                raise _config_error(f"the manual budget must be an integer, got {manual_tokens!r}")
            if manual_tokens < MIN_BUDGET_TOKENS:
                raise _config_error(
                    f"the manual budget must be at least {MIN_BUDGET_TOKENS:,} tokens, "
                    f"got {manual_tokens:,}"
                )
            budget = manual_tokens
            reason = f"manual: the configured {budget:,} tokens"
        case BudgetMode.BACKEND:
            n_ctx_from_budget = False
            if server_n_ctx is not None and server_n_ctx > 0:
                budget = server_n_ctx
                reason = f"backend: the server reports n_ctx {budget:,} per slot (/props)"
            else:
                budget, why = _full(gpu, no_gpu_reason, cpu_tokens)
                reported = "nothing" if server_n_ctx is None else f"n_ctx {server_n_ctx}"
                reason = (
                    f"backend: the server reported {reported}, so the budget falls back "
                    f"to full: {why}"
                )
        case _:
            assert_never(mode)

    if model_ctx_train is not None and 0 < model_ctx_train < budget:
        budget = model_ctx_train
        reason += f"; clamped to the model's trained context of {budget:,} tokens"

    device: Device = "cpu" if gpu is None else "gpu"
    kv_cache_type = CPU_KV_CACHE_TYPE if gpu is None else GPU_KV_CACHE_TYPE
    n_ctx = budget * parallel if n_ctx_from_budget else None
    if n_ctx is not None:
        slots = "slot" if parallel == 1 else "slots"
        reason += f"; {parallel} {slots} → --ctx-size {n_ctx:,}"
    reason += f"; KV cache {kv_cache_type} on the {device.upper()}"
    return BudgetDecision(
        mode=mode,
        budget_tokens=budget,
        device=device,
        gpu_name=None if gpu is None else gpu.name,
        gpu_count=0 if gpu is None else gpu.count,
        vram_total_bytes=None if gpu is None else gpu.total_bytes,
        kv_cache_type=kv_cache_type,
        parallel=parallel,
        n_ctx=n_ctx,
        reason=reason,
    )
