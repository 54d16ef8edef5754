"""B5: tokenizer + validator cost over streamed tool arguments, beside one orjson parse.

Run with ``make bench`` (or ``python -m bench.parse``). Tool arguments of 1, 10 and 100 KB
are wrapped in a TOOL_CALL frame and fed in 4-character chunks (about one token each);
the same document is parsed once by ``orjson.loads`` in the same run. Each figure is the
best of several repeats (the least disturbed by the rest of the machine).

Targets (docs/performance.md): µs/chunk at 100 KB ÷ µs/chunk at 1 KB ≤ 1.5 (no O(n²)); whole-stream
cost ≤ 20× one orjson parse; plain-text throughput ≥ 20 MB/s.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import orjson

from toolforge.core.events import FrameDelta, FrameEnd, FrameKind
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.core.protocol import sentinels
from toolforge.core.tokenizer import SentinelTokenizer

CHUNK = 4


def tool_arguments(size: int, seed: int = 7) -> str:
    """A realistic tool-argument document of about ``size`` bytes."""
    rng = random.Random(seed)
    words = "pizza near open late table booking party window quiet vegan crust".split()
    places: list[dict[str, object]] = []
    doc: dict[str, object] = {"query": "pizza near me", "radius_km": 3.5, "places": places}
    while len(orjson.dumps(doc)) < size:
        places.append(
            {
                "name": " ".join(rng.choices(words, k=3)).title(),
                "rating": round(rng.uniform(1, 5), 1),
                "open": rng.random() > 0.3,
                "tags": rng.choices(words, k=rng.randint(1, 4)),
                "address": {"street": f"{rng.randint(1, 999)} Main St", "zip": "94110"},
                "note": 'say "hi" \\ ⟦not a sentinel⟧ é',
            }
        )
    return orjson.dumps(doc).decode()


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def stream_once(chunks: list[str]) -> object:
    tok = SentinelTokenizer(max_frame_bytes=1 << 20)
    validator = StreamingJSONValidator(max_bytes=1 << 20)
    value: object = None
    for chunk in chunks:
        for ev in tok.feed(chunk):
            if type(ev) is FrameDelta:
                validator.feed(ev.chunk)
            elif type(ev) is FrameEnd:
                value = validator.close()
    tok.close()
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    print("| args size | chunks | µs/chunk | stream total µs | orjson.loads µs | × orjson |")
    print("|---|---|---|---|---|---|")
    per_chunk: dict[int, float] = {}
    ratios: dict[int, float] = {}
    for size in (1024, 10 * 1024, 100 * 1024):
        doc = tool_arguments(size)
        stream = sentinels.frame(FrameKind.TOOL_CALL, "t1", "places.search", doc)
        chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
        assert stream_once(chunks) == orjson.loads(doc)
        total = best_of(args.repeats, lambda chunks=chunks: stream_once(chunks))
        raw = doc.encode()
        one = best_of(args.repeats * 20, lambda raw=raw: orjson.loads(raw))
        per_chunk[size] = total / len(chunks) * 1e6
        ratios[size] = total / one
        print(
            f"| {len(raw) / 1024:.0f} KB | {len(chunks)} | {per_chunk[size]:.2f} | "
            f"{total * 1e6:.0f} | {one * 1e6:.1f} | {ratios[size]:.0f}× |"
        )

    print()
    print("| plain text, chunk size | MB/s |")
    print("|---|---|")
    text = ("The quick brown fox jumps over the lazy dog. " * 25_000)[: 1 << 20]
    throughput: dict[int, float] = {}
    for size in (4, 64, 4096):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]

        def plain(chunks: list[str] = chunks) -> None:
            tok = SentinelTokenizer()
            for chunk in chunks:
                tok.feed(chunk)
            tok.close()

        throughput[size] = len(text) / best_of(args.repeats, plain) / 1e6
        print(f"| {size} chars | {throughput[size]:.1f} |")

    scaling = per_chunk[100 * 1024] / per_chunk[1024]
    print()
    print(
        f"scaling µs/chunk 100 KB ÷ 1 KB = {scaling:.2f} (target ≤ 1.5)"
        f" {'MET' if scaling <= 1.5 else 'MISSED'}"
    )
    worst = max(ratios.values())
    print(
        f"worst whole-stream ÷ one orjson parse = {worst:.0f}× (target ≤ 20×)"
        f" {'MET' if worst <= 20 else 'MISSED'}"
    )
    print(
        f"plain text at 4-char chunks = {throughput[4]:.1f} MB/s, at 64 = "
        f"{throughput[64]:.1f} MB/s (target ≥ 20 MB/s)"
    )


if __name__ == "__main__":
    main()
