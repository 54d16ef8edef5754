"""The benchmarks' HTTP client keeps going past the gateway's keep-alive cap: a response
that says ``Connection: close`` (the ``KEEPALIVE_MAX_REQUESTS``-th on a connection) is
read whole, and the next request goes out on a new connection (B1 with 1000 requests a
side used to stop at the cap)."""

from __future__ import annotations

import asyncio

from bench._procs import scratch, spawn_gateway, spawn_upstream
from bench.gateway import Client, FirstText, gateway_body


def test_requests_past_the_keep_alive_cap_go_on_a_new_connection() -> None:
    with scratch("toolforge-client-test-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        gw = spawn_gateway(
            f"http://127.0.0.1:{up.port}/v1", artifacts, env={"KEEPALIVE_MAX_REQUESTS": "3"}
        )
        procs.append(gw)

        async def go() -> list[bool]:
            client = await Client.open(gw.port)
            request = client.request_bytes("/v1/stream", gateway_body("ttft"))
            first_conn = client.conn
            texts = []
            try:
                for _ in range(8):
                    sink = FirstText(direct=False)
                    await client.stream(request, sink, timeout_s=10)
                    texts.append(sink.ts is not None)
            finally:
                client.close()
            assert client.conn is not first_conn  # the cap was reached: a new connection
            return texts

        assert asyncio.run(go()) == [True] * 8
