"""bench.formats keeps working: B1 and B2 for every wire format run end to end at a tiny
size (real processes on loopback: the scripted upstream and a gateway), and every arm
reads its own format's text events, as many as the upstream sent tokens."""

from __future__ import annotations

import asyncio

from bench import formats
from bench._procs import scratch, spawn_gateway, spawn_upstream
from bench.gateway import Report


def _rows(rep: Report, heading: str) -> dict[str, list[str]]:
    """The table under ``heading``: cells by the row's first cell."""
    start = next(i for i, line in enumerate(rep.lines) if line.startswith(heading))
    rows: dict[str, list[str]] = {}
    for line in rep.lines[start + 4 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_every_format_beside_v1_stream() -> None:
    rep = Report()
    with scratch("toolforge-formats-test-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        gw = spawn_gateway(f"http://127.0.0.1:{up.port}/v1", artifacts)
        procs.append(gw)

        async def go() -> None:
            await formats.b1_formats(rep, up.port, gw, n=3, warmup=1)
            await formats.b2_formats(rep, up, gw, n=300, repeats=1)

        asyncio.run(go())
    labels = [formats.DIRECT.label, formats.STREAM.label, *(a.label for a in formats.FORMATS)]

    b1 = _rows(rep, "### B1 — wire formats")
    assert list(b1) == labels
    for arm in formats.FORMATS:
        p50, p99, _added, ratio, _, cpu, cpu_ratio = b1[arm.label]
        assert 0 < float(p50) <= float(p99) < 1000, arm.name  # a first text event came
        assert ratio.strip("*") and float(cpu) > 0 and float(cpu_ratio.strip("*")) > 0
    assert b1[formats.STREAM.label][3] == "**1.00**"

    b2 = _rows(rep, "### B2 — wire formats")
    assert list(b2) == labels
    for arm in formats.FORMATS:
        rate, _, cpu, ratio, _ = b2[arm.label]
        assert float(rate.replace(",", "")) > 0 and float(cpu) >= 0, arm.name
        assert ratio.startswith("**"), arm.name
    # One budget line per format, each naming its ratio to /v1/stream.
    assert [t.split(":")[0] for t, _ in rep.targets] == [f"B2f {a.name}" for a in formats.FORMATS]
    assert set(rep.facts) >= {f"b2f_{a.name}_cpu_ratio" for a in formats.FORMATS}


def test_the_websocket_frame_is_masked_and_decodes_back() -> None:
    body = b'{"type":"start","request":{"input":"hi"}}' * 5  # over 125 bytes: 16-bit length
    frame = formats.WsClient(None).request_bytes("/v1/stream/ws", body)  # type: ignore[arg-type]
    assert frame[0] == 0x81 and frame[1] == 0x80 | 126
    assert int.from_bytes(frame[2:4], "big") == len(body)
    mask, payload = frame[4:8], frame[8:]
    assert bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) == body
