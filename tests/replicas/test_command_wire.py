"""The envelope of stream commands between replicas carries its wire version: during a
rolling upgrade a replica refuses a message of another version with a typed error,
instead of reading it as its own (docs/deployment.md), over a real ``redis-server``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from tests.replicas.conftest import RedisServer
from toolforge.errors import ErrorCode
from toolforge.runtime.cluster import RedisCluster, RemoteError
from toolforge.runtime.cluster.commands import WIRE_VERSION
from toolforge.runtime.cluster.keys import channel, meta_key


@pytest.fixture
async def owner(redis_server: RedisServer) -> AsyncIterator[tuple[RedisCluster, list[Any]]]:
    """A replica whose command handler records what it was asked, and answers."""
    seen: list[Any] = []

    async def handler(stream_id: str, command: dict[str, Any]) -> dict[str, Any]:
        seen.append((stream_id, command))
        return {"stream_id": stream_id, "cancelled": True}

    cluster = RedisCluster(
        redis_server.url, timeout_s=0.5, flush_s=0, replica_ttl_s=1, resume_ttl_s=5
    )
    await cluster.start(handler)
    await asyncio.sleep(0.2)  # subscribed
    try:
        yield cluster, seen
    finally:
        await cluster.aclose()


async def _ask(url: str, to: str, message: dict[str, Any]) -> dict[str, Any]:
    """Publish ``message`` on replica ``to``'s channel as a replica of another release
    would; its reply, as read on the asker's own channel."""
    client = aioredis.Redis.from_url(url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(channel("r_old"))
        await client.publish(channel(to), orjson.dumps(message))
        async with asyncio.timeout(5):
            while True:
                got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if got is not None:
                    reply: dict[str, Any] = orjson.loads(got["data"])
                    return reply
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
        await client.aclose()


@pytest.mark.parametrize("version", [None, 1, WIRE_VERSION + 1])
async def test_a_command_of_another_wire_version_is_refused_not_misread(
    owner: tuple[RedisCluster, list[Any]], redis_server: RedisServer, version: int | None
) -> None:
    cluster, seen = owner
    message: dict[str, Any] = {"stream_id": "s_1", "command": {"type": "cancel"}}
    message |= {"reply_to": "r_old", "corr": "c1"}
    if version is not None:
        message["v"] = version
    reply = await _ask(redis_server.url, cluster.conn.replica_id, message)
    assert reply["corr"] == "c1" and reply["status"] == 503
    assert reply["error"]["code"] == ErrorCode.COMMAND_VERSION_UNSUPPORTED
    assert reply["error"]["retryable"] is True
    assert f"v{version or 1}" in reply["error"]["message"]
    assert seen == []  # the handler never saw it


async def test_a_command_of_this_wire_version_is_applied(
    owner: tuple[RedisCluster, list[Any]], redis_server: RedisServer
) -> None:
    cluster, seen = owner
    message = {"v": WIRE_VERSION, "stream_id": "s_1", "command": {"type": "cancel"}}
    message |= {"reply_to": "r_old", "corr": "c2"}
    reply = await _ask(redis_server.url, cluster.conn.replica_id, message)
    assert reply == {
        "v": WIRE_VERSION,
        "corr": "c2",
        "answer": {"stream_id": "s_1", "cancelled": True},
    }
    assert seen == [("s_1", {"type": "cancel"})]


async def test_an_unreadable_control_message_leaves_the_channel_serving(
    owner: tuple[RedisCluster, list[Any]], redis_server: RedisServer
) -> None:
    cluster, _ = owner
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        await client.publish(channel(cluster.conn.replica_id), b"not json")
        await client.publish(channel(cluster.conn.replica_id), b"[1, 2]")
    finally:
        await client.aclose()
    message = {"v": WIRE_VERSION, "stream_id": "s_1", "command": {"type": "cancel"}}
    message |= {"reply_to": "r_old", "corr": "c3"}
    reply = await _ask(redis_server.url, cluster.conn.replica_id, message)
    assert reply["answer"]["cancelled"] is True


async def test_an_answer_of_another_wire_version_is_a_typed_refusal(
    redis_server: RedisServer,
) -> None:
    """The asking side: an owner of another release answers in its own format; the asker
    raises the typed refusal rather than reading the answer as its own."""
    asker = RedisCluster(
        redis_server.url, timeout_s=0.5, flush_s=0, replica_ttl_s=1, resume_ttl_s=5
    )
    await asker.start(lambda *_: asyncio.sleep(0, {}))
    client = aioredis.Redis.from_url(redis_server.url)
    pubsub = client.pubsub()
    try:
        await client.hset(meta_key("s_old"), mapping={"owner": "r_old", "state": "running"})
        await pubsub.subscribe(channel("r_old"))
        await asyncio.sleep(0.2)

        async def old_owner() -> None:  # answers as a replica of a later release would
            while True:
                got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if got is not None:
                    asked = orjson.loads(got["data"])
                    assert asked["v"] == WIRE_VERSION and asked["command"] == {"type": "cancel"}
                    reply = {"v": WIRE_VERSION + 1, "corr": asked["corr"], "result": {}}
                    await client.publish(channel(asked["reply_to"]), orjson.dumps(reply))
                    return

        answering = asyncio.create_task(old_owner())
        with pytest.raises(RemoteError) as refused:
            await asker.commands.send("s_old", {"type": "cancel"})
        await answering
        assert refused.value.code == ErrorCode.COMMAND_VERSION_UNSUPPORTED
        assert refused.value.http_status == 503 and refused.value.retryable
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
        await client.aclose()
        await asker.aclose()
