"""Stream commands as values: each survives the trip to another replica unchanged, a
malformed or unknown one is a typed BAD_REQUEST (never a crash of the owner), and a
stream takes commands from the key that started it only."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.commands import (
    Approve,
    Cancel,
    ClientFailure,
    Command,
    PostToolResult,
    check_caller,
    from_wire,
    to_wire,
)

COMMANDS: list[Command] = [
    Cancel(),
    Approve("call_1", approved=True),
    Approve("call_2", approved=False),
    PostToolResult("call_3", ok=True, result={"temp": 21, "list": [1, None, "x"]}),
    PostToolResult("call_4", ok=False, error=ClientFailure("GPS_OFF", "no fix\nat all")),
]


@pytest.mark.parametrize("command", COMMANDS, ids=repr)
def test_every_command_crosses_the_wire_unchanged(command: Command) -> None:
    import orjson

    assert from_wire(orjson.loads(orjson.dumps(to_wire(command)))) == command


@pytest.mark.parametrize(
    "wire",
    [
        {},
        {"type": "approve"},
        {"type": "tool_result", "call_id": "c"},
        {"type": "tool_result", "call_id": "c", "ok": False, "error": "boom"},
        {"type": "rm -rf"},
        {"type": None},
    ],
)
def test_a_malformed_command_is_a_typed_bad_request(wire: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as caught:
        from_wire(wire)
    assert caught.value.code == ErrorCode.BAD_REQUEST
    assert caught.value.http_status == 400


@pytest.mark.parametrize(
    ("caller", "owner", "allowed"),
    [
        (None, None, True),  # no keys configured
        ("alice", "alice", True),
        ("bob", "alice", False),
        (None, "alice", False),  # a forwarded command without its caller's key
        ("bob", None, False),
    ],
)
def test_only_the_starting_key_commands_a_stream(
    caller: str | None, owner: str | None, allowed: bool
) -> None:
    if allowed:
        check_caller(caller, owner, "s_1")
        return
    with pytest.raises(RequestError) as caught:
        check_caller(caller, owner, "s_1")
    assert caught.value.code == ErrorCode.FORBIDDEN and caught.value.http_status == 403
