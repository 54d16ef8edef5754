"""The Redis client's C parts (app/runtime/cluster/connection.py): ``hiredis`` is a
dependency, redis-py reads every reply with it, and the gateway's asyncio connections pack
their commands with ``hiredis.pack_command``: the same bytes as redis-py's own packer,
which the replicas' tests then run against a real ``redis-server``.
"""

from __future__ import annotations

import redis.asyncio as aioredis
import redis.utils
from redis._parsers import _AsyncHiredisParser
from redis.asyncio.connection import AbstractConnection, UnixDomainSocketConnection
from redis.asyncio.connection import Connection as PythonPacking
from redis.exceptions import DataError

from tests.replicas.conftest import RedisServer, ReplicaFactory
from toolforge.runtime.cluster.connection import PARSER, Connection, hiredis_packing
from toolforge.runtime.cluster.keys import frames_key, meta_key

OPTIONS = {"timeout_s": 2.0, "replica_ttl_s": 5.0}

# What the gateway sends, and what could go wrong in a packer: the mirror's EVALSHA with
# frames holding CRLF and non-ASCII text, a value over redis-py's 6,000-byte chunking
# cutoff, a memoryview, command names of two words (str and bytes), floats and big ints.
FRAMES = 'id: 7\nevent: token\ndata: {"t":"h\\u00e9 \\r\\n ✓"}\n\n'.encode()
COMMANDS: list[tuple[object, ...]] = [
    ("EVALSHA", "a" * 40, 2, frames_key("s_1"), meta_key("s_1"), "9-0", 7, FRAMES, 0, 600000),
    ("EVALSHA", "b" * 40, 3, "k1", "k2", "k3", "12-0", 10, FRAMES * 400, 1, 5, "r_ab", "ké"),
    ("SET", "tf:k:x", memoryview(b"a\r\nb"), "PX", 1500, "NX"),
    ("SCRIPT LOAD", "return 1"),
    (b"CLIENT SETNAME", b"tf"),
    ("ZADD", "q", 0.1, "m", 1e20, "n", -0.0, "o", 1 / 3, "p"),
    ("INCRBY", "n", 2**70),
    ("PUBLISH", "tf:c:r_ab", b"\x00\xff" * 4000),
    ("HSET", "m", "state", "", "owner", "r_ab"),
]


def _packed(packer: AbstractConnection, cmd: tuple[object, ...]) -> bytes:
    return b"".join(bytes(chunk) for chunk in packer.pack_command(*cmd))  # type: ignore[arg-type]


async def test_hiredis_is_installed_and_redis_py_reads_replies_with_it(
    redis_server: RedisServer,
) -> None:
    assert redis.utils.HIREDIS_AVAILABLE, "pip install -e . should have installed hiredis"
    assert PARSER == "hiredis"
    conn = Connection(redis_server.url, OPTIONS)  # type: ignore[arg-type]
    try:
        await conn.call("the test", conn.redis.set("tf:t", FRAMES))
        assert await conn.call("the test", conn.redis.get("tf:t")) == FRAMES
        pool = conn.redis.connection_pool
        used = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            assert isinstance(used._parser, _AsyncHiredisParser)
            assert type(used) is hiredis_packing(PythonPacking)
        finally:
            await pool.release(used)
    finally:
        await conn.aclose()


def test_hiredis_packing_sends_redis_py_s_own_bytes() -> None:
    python = PythonPacking()
    fast = hiredis_packing(PythonPacking)()
    for cmd in COMMANDS:
        assert _packed(fast, cmd) == _packed(python, cmd), cmd
    # A pipeline's commands, packed together.
    together = [bytes(chunk) for chunk in fast.pack_commands(COMMANDS)]  # type: ignore[arg-type]
    assert b"".join(together) == b"".join(bytes(c) for c in python.pack_commands(COMMANDS))  # type: ignore[arg-type]
    # What redis-py refuses, it still refuses, with its own error.
    for bad in (None, True, bytearray(b"x")):
        for packer in (fast, python):
            try:
                packer.pack_command("SET", "k", bad)  # type: ignore[arg-type]
            except DataError as exc:
                assert type(bad).__name__ in str(exc)
            else:
                raise AssertionError(f"{bad!r} was packed")


def test_every_scheme_keeps_its_own_connection_class() -> None:
    # A unix:// URL keeps its socket connection (and rediss:// its TLS one): the packing
    # is a subclass of whichever class redis-py chose, built once.
    pool = aioredis.BlockingConnectionPool.from_url("unix:///tmp/none.sock")
    packed = hiredis_packing(pool.connection_class)
    assert issubclass(packed, UnixDomainSocketConnection)
    assert hiredis_packing(pool.connection_class) is packed


async def test_the_gateway_logs_which_parser_and_packer_it_uses(
    replicas: ReplicaFactory,
) -> None:
    (a,) = await replicas(1, LOG_LEVEL="INFO")
    line = next(line for line in a.log.read_text().splitlines() if "redis.client" in line)
    assert "hiredis" in line and "parser" in line and "packer" in line, line
    assert "python" not in line, line
