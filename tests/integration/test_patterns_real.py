"""A tool whose argument carries a ``pattern``, on the real SmolLM2-135M: the grammar holds
the model to it (five digits for an order number), through the proxy as an agent loop
would call it, with the call required."""

from __future__ import annotations

import re

import orjson

from tests.integration.conftest import Live

ORDER = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "The status of an order, by its five-digit number.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "pattern": "^[0-9]{5}$"},
                "placed_on": {"type": "string", "format": "date"},
            },
            "required": ["order_id", "placed_on"],
            "additionalProperties": False,
        },
    },
}


async def test_a_pattern_and_a_format_hold_the_model(live: Live) -> None:
    for seed in (1, 2, 3):
        body = {
            "model": "default",
            "messages": [
                {"role": "user", "content": "Where is my order 48213? I ordered it on 3 May."}
            ],
            "tools": [ORDER],
            "tool_choice": {"type": "function", "function": {"name": "get_order"}},
            "seed": seed,
            "temperature": 0.8,
        }
        response = await live.client.post(f"{live.url}/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        (call,) = message["tool_calls"]
        args = orjson.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_order"
        assert re.fullmatch(r"[0-9]{5}", args["order_id"]), (seed, args)
        assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", args["placed_on"]), (seed, args)
