"""Each wire format's per-token cost, beside the proxy's: the one function a format runs per
``text.delta`` frame, in one process, taking turns.

Run with ``python -m bench.wire_writers`` (``--frames N``, ``--rounds R``). Every format is
an encoder over the same engine and session (docs/architecture.md): ``POST /v1/stream``
writes its frames as they are; the proxy (``ChunkWriter``), the Responses API
(``ResponseWriter``), AG-UI (``RunWriter``) and the AI SDK's UI stream
(``UIStreamWriter``) re-encode each batch the frame log hands over. What a format adds to
``/v1/stream``'s CPU per token is this re-encoding (bench/RESULTS.md, B2 and B2p: the proxy's
0.5 µs of 7.0 µs a token). Reported: ns per ``text.delta`` frame in batches of 8, median
and minimum of rounds that rotate which format goes first; and each format's first batch
(the events in front of the first token: its share of the time to first event).

Never writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from toolforge.core.protocol.agui import RunWriter
from toolforge.core.protocol.ai_sdk_ui import UIStreamWriter
from toolforge.core.protocol.frames import StreamBegin, TextDelta, encode_frame
from toolforge.core.protocol.openai import ChunkWriter
from toolforge.core.protocol.responses import ResponseWriter

BATCH = 8  # frames per batch: what the frame log hands a fast reader at full speed
FIRSTS = 200  # first batches timed per round (new writers), their median kept

Encode = Callable[[bytes], bytes]


def writers() -> dict[str, Callable[[], Encode]]:
    """Each format's writer, made anew, as the encoder its route plugs in."""

    def chat() -> Encode:
        w = ChunkWriter(
            stream_id="s_b", completion_id="c", created=0, model="m",
            include_usage=False, mode="native",
        )  # fmt: skip
        w.first()
        return w.batch

    def responses() -> Encode:
        w = ResponseWriter(response_id="resp_b", created_at=0, echo={}, stream_id="s_b", mode="n")
        return lambda b: w.batch(b, now=0)

    def agui() -> Encode:
        return RunWriter(thread_id="t", run_id="r", stream_id="s_b").batch

    def ui() -> Encode:
        return UIStreamWriter(message_id="m", stream_id="s_b").batch

    return {"chat-completions": chat, "responses": responses, "ag-ui": agui, "ui-stream": ui}


def batches(frames: int) -> tuple[bytes, list[bytes]]:
    """The first batch (``stream.begin`` and a first token) and the rest, 8 frames each."""
    begin = StreamBegin(stream_id="s_b", model="m", mode="native", budget_tokens=None)
    first = encode_frame(1, begin) + encode_frame(2, TextDelta(chunk=" hello"))
    encoded = [encode_frame(i + 3, TextDelta(chunk=" word")) for i in range(frames)]
    rest = [b"".join(encoded[i : i + BATCH]) for i in range(0, frames, BATCH)]
    return first, rest


def run(frames: int, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    first, rest = batches(frames)
    made = writers()
    names = list(made)
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            firsts = []
            for _ in range(FIRSTS):  # many streams' first batches: one alone is noise
                encode = made[name]()
                started = time.perf_counter_ns()
                encode(first)
                firsts.append(time.perf_counter_ns() - started)
            opened = time.perf_counter_ns()
            for batch in rest:
                encode(batch)
            ended = time.perf_counter_ns()
            out[name][0].append(statistics.median(firsts) / 1000)
            out[name][1].append((ended - opened) / frames)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    results = run(args.frames, args.rounds)
    print(f"{'format':18} {'ns/token median':>16} {'min':>8} {'first batch µs':>15}")
    for name, (firsts, per_token) in results.items():
        print(
            f"{name:18} {statistics.median(per_token):16.0f} {min(per_token):8.0f} "
            f"{statistics.median(firsts):15.1f}"
        )


if __name__ == "__main__":
    main()
