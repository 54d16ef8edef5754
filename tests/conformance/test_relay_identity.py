"""The relay and the queued path write the same stream, for every conformance case.

Each scripted case runs twice on fresh gateways, ``STREAM_RELAY`` off then on, with the
upstream's bytes cut at the same random places (each step's bytes split into several
writes at offsets drawn from a seed of the case's own) and three in four of the steps
that came at once paced by a millisecond, so that their bytes arrive in reads of their own
and the relay's read path (deltas taken in the socket's read callback) runs between them: the
client must receive the same frames, byte for byte once decoded, but for what is measured
or random in them (stream ids, durations, rates), and the case's own verdict must be the
same.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from toolforge.eval.conformance import DEFAULT_CASES_DIR, Case, load_cases, run_case
from toolforge.upstream.openai_compat import ChatStream

CASES = [c for c in load_cases(DEFAULT_CASES_DIR) if not c.real and c.error is None]

# Cases whose client acts on a timer or mid-stream (cancel, hang up, stall, resume): how
# many frames the gateway produced before the client acted depends on the scheduler, on
# either path. Their frames are compared up to the shorter of the two streams, less its
# last frame (a client that hangs up may have read only part of it).
_TIMED_MODES = frozenset({"cancel", "disconnect", "stall", "resume", "slow"})


def split_upstream(case: Case, seed: str) -> Case:
    """``case`` with every scripted step's bytes cut into several writes at random."""
    rng = random.Random(seed)
    scripts: list[dict[str, Any]] = []
    for script in case.upstream or ():
        steps = []
        for step in script.get("steps", ()):
            cuts = {rng.randrange(1, 40 + 2 * len(step.get("text") or step.get("raw") or ""))}
            cuts |= {rng.randrange(1, 200) for _ in range(rng.randrange(3))}
            paced = {} if step.get("delay_ms") or rng.random() < 0.25 else {"delay_ms": 1}
            steps.append({**step, **paced, "split": sorted(cuts | set(step.get("split", ())))})
        scripts.append({**script, "steps": steps})
    return dataclasses.replace(case, upstream=tuple(scripts))


def normalised(value: Any, key: str = "") -> Any:
    """``value`` with what differs from run to run on any path replaced by its type."""
    if isinstance(value, dict):
        return {k: normalised(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if key == "stream_id" or key.endswith("_ms") or key.endswith("_per_s"):
        return type(value).__name__
    return value


async def _frames(
    case: Case, relay: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[str], list[Any], int]:
    """The case's verdict and what failed in it, its frames, and how many socket reads
    the read callback took."""
    taken = 0
    data = ChatStream.data

    def counted(stream: ChatStream, chunk: bytes) -> None:
        nonlocal taken
        taken += 1
        data(stream, chunk)

    varied = dataclasses.replace(case, settings={**case.settings, "stream_relay": relay})
    with monkeypatch.context() as patch:
        patch.setattr(ChatStream, "data", counted)
        result = await run_case(varied)
    return result.status, result.failures, [normalised(f) for f in result.frames], taken


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_relay_and_queue_write_the_same_stream(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    split = split_upstream(case, case.name)
    queued_status, queued_failed, queued, queued_taken = await _frames(split, False, monkeypatch)
    relay_status, relay_failed, relayed, _ = await _frames(split, True, monkeypatch)
    assert queued_taken == 0  # the queued path reads every byte in the task
    assert relay_status == queued_status, {"queued": queued_failed, "relay": relay_failed}
    if case.mode in _TIMED_MODES:
        n = min(len(queued), len(relayed)) - 1
        queued, relayed = queued[:n], relayed[:n]
    assert relayed == queued
