"""bench.load keeps working: B5 and B6 run end to end at a tiny size (real processes on
loopback: the scripted upstream, a gateway, the bare relay, a client process), and what
they report follows from what the clients saw."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from bench import load
from bench._procs import scratch, spawn_gateway, spawn_proxy, spawn_upstream
from bench.gateway import Report


@pytest.fixture(scope="module")
def clients() -> Iterator[load.Clients]:
    with load.client_processes(1) as c:
        yield c


def _rows(rep: Report, prefix: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in rep.lines
        if line.startswith(prefix)
    ]


def _b5(clients: load.Clients, *, relay: bool) -> Report:
    """B5 at N = 3 streams of 4 tokens, with or without the bare relay's arm."""
    rep = Report()
    with scratch("toolforge-load-test-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        proxy = spawn_proxy(up.port) if relay else None
        if proxy is not None:
            procs.append(proxy)
        url = f"http://127.0.0.1:{up.port}/v1"
        asyncio.run(load.b5(rep, clients, url, up, artifacts, sizes=[3], tokens=4, relay=proxy))
    return rep


def test_b5_counts_every_paced_stream_on_both_paths(clients: load.Clients) -> None:
    rep = _b5(clients, relay=False)
    direct, gateway = _rows(rep, "| 3 |")
    assert direct[1] == "direct" and direct[2] == "3" and direct[-1] == "0"
    assert gateway[1].startswith("gateway") and gateway[2] == "3" and gateway[-1] == "0"
    # 3 streams of 4 tokens 100 ms apart: every gap is about 100 ms on both paths.
    assert 90 < float(direct[3]) < 200 and 90 < float(gateway[3]) < 200
    assert float(gateway[6]) > 0  # the gateway spent CPU on them
    assert re.search(r"\(\d+\)", gateway[7])  # RSS per stream, with the count it was read at
    assert rep.targets[0] == ("B5 every stream complete at N = 3: 3 of 3", True)
    assert rep.facts["b5_3_complete"] == 3


def test_b5_measures_the_bare_relay_beside_the_gateway(clients: load.Clients) -> None:
    rep = _b5(clients, relay=True)
    rows = _rows(rep, "| 3 |")
    assert [r[1].split(" `")[0] for r in rows] == ["direct", "bare TCP relay", "gateway"]
    relay_row = rows[1]
    assert relay_row[2] == "3" and relay_row[-1] == "0"  # every stream through it, none failed
    assert 90 < float(relay_row[3]) < 200  # paced as the others
    # Its own CPU per paced token (the floor): /proc counts 10 ms ticks, which a dozen
    # tokens through a bare relay may not reach; a figure is there, and it is not negative.
    assert float(relay_row[6]) >= 0
    # The fact keeps full precision; the table prints one decimal.
    assert round(rep.facts["b5_3_relay_cpu"], 1) == float(relay_row[6])
    cpu_target = next(text for text, _ in rep.targets if "CPU per paced token" in text)
    assert f"the floor: {relay_row[6]} µs" in cpu_target


def test_b6_sends_at_the_rate_asked_on_every_path(clients: load.Clients) -> None:
    rep = Report()
    with scratch("toolforge-load-test-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        relay = spawn_proxy(up.port)
        procs.append(relay)
        gw = spawn_gateway(f"http://127.0.0.1:{up.port}/v1", artifacts)
        procs.append(gw)

        async def go() -> None:
            await load._warm_gateway(gw.port)
            await load.b6(rep, clients, up, gw, relay, [20.0], warmup_s=0.2, measure_s=1.0)

        asyncio.run(go())
    rows = _rows(rep, "| 20 |")
    assert [r[1] for r in rows] == ["direct", "relay", "gateway"]
    for row in rows:
        assert 15 <= float(row[2]) <= 25, row  # about 20 requests in the measured second
        assert row[6] == "0", row  # nothing failed
        assert 0 < float(row[3]) <= float(row[4]), row  # p50 ≤ p99, both measured
    cpu = [[float(x) if x != "–" else None for x in r[8].split(" / ")] for r in rows]
    assert [c[0] is None for c in cpu] == [True, True, False]  # the gateway's, its row only
    assert cpu[2][0] is not None and cpu[2][0] > 0  # the gateway's CPU per request
    for row, (_, upstream, clients_cpu) in zip(rows, cpu, strict=True):
        # /proc counts the upstream's CPU in 10 ms ticks, which 24 requests may not reach;
        # the clients' own clock is finer: they always read something.
        assert upstream is not None and upstream >= 0, row
        assert clients_cpu is not None and clients_cpu > 0, row
    # The ceilings follow from the same figures: the gateway's path costs more than direct.
    ceiling = {k[len("b6_ceiling_") :]: v for k, v in rep.facts.items() if "ceiling" in k}
    assert set(ceiling) == {"direct", "relay", "gateway", "gateway_alone"}
    assert 0 < ceiling["gateway"] < ceiling["direct"]
    assert ceiling["gateway_alone"] == pytest.approx(1e3 / cpu[2][0], rel=0.01)
    assert any(line.startswith("The machine's ceiling") for line in rep.lines)
    assert rep.targets[-1][0].startswith("B6 highest rate")
