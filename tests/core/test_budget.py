"""Context budget decisions (docs/servers.md): tiers at their exact edges, every mode, the errors,
and the sentence that explains each decision."""

from __future__ import annotations

import json

import pytest

from toolforge.core.budget import (
    _TIER_LABELS,
    CPU_FULL_TOKENS,
    GB,
    MIN_BUDGET_TOKENS,
    VRAM_TIERS,
    BudgetDecision,
    BudgetMode,
    GpuDevice,
    GpuInfo,
    decide,
    tier_tokens,
)
from toolforge.errors import ErrorCode, RequestError

MiB = 1024 * 1024


def gpu(*totals: int, name: str = "NVIDIA Test") -> GpuInfo:
    return GpuInfo(
        tuple(
            GpuDevice(index=i, name=name, total_bytes=t, free_bytes=t // 2)
            for i, t in enumerate(totals)
        )
    )


# --------------------------------------------------------------------------- tiers


@pytest.mark.parametrize(
    ("vram_bytes", "tokens"),
    [
        (0, 4_096),
        (8 * GB, 4_096),
        (23_900_000_000, 4_096),  # 23.9 GB
        (24 * GB - 1, 4_096),
        (24 * GB, 32_768),  # the edge belongs to the upper tier ("24-48")
        (47_900_000_000, 32_768),  # 47.9 GB
        (48 * GB - 1, 32_768),
        (48 * GB, 262_144),  # "≥ 48 GB"
        (80 * GB, 262_144),
        (-1, 4_096),  # nonsense in, the smallest tier out: never an error
    ],
)
def test_tier_edges_are_decimal_gigabytes(vram_bytes: int, tokens: int) -> None:
    assert tier_tokens(vram_bytes) == tokens


@pytest.mark.parametrize(
    ("card", "total_bytes", "tokens", "with_gib_edges"),
    [
        # What NVML reports for real cards: nominal GiB minus the driver's reservation.
        # Decimal-GB edges put each card in the tier its label names; GiB edges would not.
        ("RTX 4080 16 GB", 16_376 * MiB, 4_096, 4_096),
        ("RTX 4090 24 GB", 24_564 * MiB, 32_768, 4_096),
        ("RTX A6000 48 GB", 49_140 * MiB, 262_144, 32_768),
        ("H100 80 GB", 81_559 * MiB, 262_144, 262_144),
    ],
)
def test_real_cards_land_in_the_tier_on_their_label(
    card: str, total_bytes: int, tokens: int, with_gib_edges: int
) -> None:
    assert tier_tokens(total_bytes) == tokens, card
    gib_tier = (
        262_144 if total_bytes >= 48 * 1024**3 else 32_768 if total_bytes >= 24 * 1024**3 else 4_096
    )
    assert gib_tier == with_gib_edges, card


def test_tiers_are_ordered_and_labelled() -> None:
    floors = [floor for floor, _ in VRAM_TIERS]
    assert floors == sorted(floors, reverse=True) and floors[-1] == 0
    assert set(_TIER_LABELS) == {tokens for _, tokens in VRAM_TIERS}


# --------------------------------------------------------------------------- GpuInfo


def test_several_gpus_sum_their_memory() -> None:
    two = gpu(24 * GB, 24 * GB, name="NVIDIA RTX A5000")
    assert (two.count, two.total_bytes, two.free_bytes) == (2, 48 * GB, 24 * GB)
    assert two.name == "2 × NVIDIA RTX A5000"
    # Two 24 GB cards are one ≥ 48 GB budget: llama-server splits layers and KV cache.
    assert decide("full", gpu=two).budget_tokens == 262_144


def test_mixed_gpus_are_named_one_by_one() -> None:
    mixed = GpuInfo(
        (
            GpuDevice(0, "NVIDIA A", 10 * GB, 1),
            GpuDevice(1, "NVIDIA B", 20 * GB, 2),
        )
    )
    assert mixed.name == "NVIDIA A + NVIDIA B"
    assert mixed.to_dict()["devices"] == [
        {"index": 0, "name": "NVIDIA A", "total_bytes": 10 * GB, "free_bytes": 1},
        {"index": 1, "name": "NVIDIA B", "total_bytes": 20 * GB, "free_bytes": 2},
    ]


def test_gpu_info_needs_a_device() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        GpuInfo(())


# --------------------------------------------------------------------------- modes


@pytest.mark.parametrize(
    ("total", "full"),
    [(12 * GB, 4_096), (24 * GB, 32_768), (80 * GB, 262_144)],
)
def test_full_is_the_tier_and_fast_is_half(total: int, full: int) -> None:
    card = gpu(total)
    f = decide(BudgetMode.FULL, gpu=card)
    s = decide(BudgetMode.FAST, gpu=card)
    assert (f.budget_tokens, s.budget_tokens) == (full, full // 2)
    assert f.device == s.device == "gpu"
    assert f.kv_cache_type == s.kv_cache_type == "q8_0"
    assert f.vram_total_bytes == total
    assert f.n_ctx == full and s.n_ctx == full // 2  # one slot


def test_full_reason_names_the_vram_the_card_and_the_tier() -> None:
    d = decide("full", gpu=gpu(81_559 * MiB, name="NVIDIA H100 80GB HBM3"))
    assert d.reason.startswith(
        "full: 85.5 GB of VRAM on NVIDIA H100 80GB HBM3 is in the ≥ 48 GB tier: "
        "262,144 tokens for full"
    )
    assert d.reason.endswith("; 1 slot → --ctx-size 262,144; KV cache q8_0 on the GPU")


def test_vram_in_the_reason_is_truncated_not_rounded() -> None:
    d = decide("full", gpu=gpu(48 * GB - 1))
    assert "47.9 GB of VRAM" in d.reason and "24-48 GB tier" in d.reason


def test_fast_reason_says_half() -> None:
    d = decide("fast", gpu=gpu(30 * GB))
    assert "24-48 GB tier: 32,768 tokens for full; fast is half: 16,384 tokens" in d.reason


def test_cpu_decision_is_clear_not_an_error() -> None:
    full = decide("full", gpu=None, no_gpu_reason="Driver Not Loaded")
    fast = decide("fast", gpu=None, no_gpu_reason="Driver Not Loaded")
    assert (full.budget_tokens, fast.budget_tokens) == (CPU_FULL_TOKENS, CPU_FULL_TOKENS // 2)
    assert full.device == "cpu" and full.kv_cache_type == "f16"
    assert (full.gpu_name, full.gpu_count, full.vram_total_bytes) == (None, 0, None)
    assert full.reason == (
        "full: no NVIDIA GPU found (NVML: Driver Not Loaded): CPU decision, "
        "4,096 tokens for full; 1 slot → --ctx-size 4,096; KV cache f16 on the CPU"
    )
    assert "fast is half: 2,048 tokens" in fast.reason


def test_cpu_budget_is_configurable() -> None:
    assert decide("full", gpu=None, cpu_tokens=8_192).budget_tokens == 8_192
    assert decide("fast", gpu=None, cpu_tokens=8_192).budget_tokens == 4_096


def test_manual_uses_the_configured_number_on_any_device() -> None:
    on_gpu = decide("manual", gpu=gpu(80 * GB), manual_tokens=10_000)
    on_cpu = decide("manual", gpu=None, manual_tokens=10_000)
    assert on_gpu.budget_tokens == on_cpu.budget_tokens == 10_000
    assert (on_gpu.device, on_cpu.device) == ("gpu", "cpu")
    assert on_gpu.reason.startswith("manual: the configured 10,000 tokens")


def test_backend_trusts_the_servers_per_slot_n_ctx() -> None:
    d = decide("backend", gpu=None, server_n_ctx=8_192, parallel=2)
    assert d.budget_tokens == 8_192
    assert d.n_ctx is None  # the server chose its own --ctx-size; we pass none
    assert d.reason.startswith("backend: the server reports n_ctx 8,192 per slot (/props)")
    assert "--ctx-size" not in d.server_args()


@pytest.mark.parametrize(("reported", "word"), [(None, "nothing"), (0, "n_ctx 0")])
def test_backend_without_an_answer_falls_back_to_full(reported: int | None, word: str) -> None:
    d = decide("backend", gpu=gpu(24 * GB), server_n_ctx=reported)
    assert d.mode is BudgetMode.BACKEND
    assert d.budget_tokens == 32_768
    assert d.reason.startswith(
        f"backend: the server reported {word}, so the budget falls back to full: "
    )
    cpu = decide("backend", gpu=None, no_gpu_reason="NVML Shared Library Not Found")
    assert cpu.budget_tokens == CPU_FULL_TOKENS
    assert "no NVIDIA GPU found (NVML: NVML Shared Library Not Found)" in cpu.reason


# --------------------------------------------------------------------------- slots, clamp


def test_slots_multiply_the_servers_ctx_size() -> None:
    d = decide("full", gpu=gpu(24 * GB), parallel=4)
    assert (d.budget_tokens, d.parallel, d.n_ctx) == (32_768, 4, 131_072)
    assert "4 slots → --ctx-size 131,072" in d.reason


@pytest.mark.parametrize("mode", ["full", "fast", "manual", "backend"])
def test_clamped_to_the_models_trained_context(mode: str) -> None:
    d = decide(
        mode,
        gpu=gpu(80 * GB),
        manual_tokens=100_000,
        server_n_ctx=131_072,
        parallel=2,
        model_ctx_train=8_192,
    )
    assert d.budget_tokens == 8_192
    assert "clamped to the model's trained context of 8,192 tokens" in d.reason
    assert d.n_ctx in (None, 16_384)


def test_no_clamp_when_the_budget_fits_or_the_train_length_is_unknown() -> None:
    assert decide("fast", gpu=None, model_ctx_train=8_192).budget_tokens == 2_048
    assert decide("full", gpu=gpu(80 * GB), model_ctx_train=0).budget_tokens == 262_144
    assert "clamped" not in decide("full", gpu=None, model_ctx_train=4_096).reason


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "manual"}, "budget mode manual needs a token count"),
        ({"mode": "manual", "manual_tokens": 100}, "at least 512 tokens, got 100"),
        ({"mode": "manual", "manual_tokens": True}, "must be an integer, got True"),
        ({"mode": "manual", "manual_tokens": "8192"}, "must be an integer, got '8192'"),
        ({"mode": "turbo"}, "unknown budget mode 'turbo': use one of backend, manual"),
        ({"mode": "full", "parallel": 0}, "parallel slots must be an integer ≥ 1, got 0"),
        ({"mode": "full", "cpu_tokens": 100}, "the CPU budget must be at least 512"),
    ],
)
def test_bad_configuration_is_a_request_error(kwargs: dict[str, object], message: str) -> None:
    mode = kwargs.pop("mode")
    with pytest.raises(RequestError) as info:
        decide(mode, gpu=None, **kwargs)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert message in info.value.message


def test_the_smallest_manual_budget_is_accepted() -> None:
    d = decide("manual", gpu=None, manual_tokens=MIN_BUDGET_TOKENS)
    assert d.budget_tokens == MIN_BUDGET_TOKENS


# --------------------------------------------------------------------------- reporting


def test_to_dict_is_json_and_complete() -> None:
    d = decide("fast", gpu=gpu(80 * GB, name="NVIDIA H100"), parallel=2)
    out = d.to_dict()
    assert json.loads(json.dumps(out)) == out
    assert out == {
        "mode": "fast",
        "budget_tokens": 131_072,
        "device": "gpu",
        "gpu_name": "NVIDIA H100",
        "gpu_count": 1,
        "vram_total_bytes": 80 * GB,
        "kv_cache_type": "q8_0",
        "parallel": 2,
        "n_ctx": 262_144,
        "reason": d.reason,
    }
    assert set(out) == set(BudgetDecision.__dataclass_fields__)


def test_server_args_carry_out_the_decision() -> None:
    on_gpu = decide("full", gpu=gpu(24 * GB), parallel=2)
    assert on_gpu.server_args() == (
        "--ctx-size",
        "65536",
        "--parallel",
        "2",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--flash-attn",  # llama.cpp refuses a quantised V cache without it
        "on",
    )
    on_cpu = decide("full", gpu=None)
    assert on_cpu.server_args() == (
        "--ctx-size",
        "4096",
        "--parallel",
        "1",
        "--cache-type-k",
        "f16",
        "--cache-type-v",
        "f16",
    )


def test_decisions_are_values() -> None:
    a = decide("full", gpu=gpu(24 * GB))
    assert a == decide(BudgetMode.FULL, gpu=gpu(24 * GB))
    with pytest.raises(AttributeError):
        a.budget_tokens = 1  # type: ignore[misc]
