"""prompt.json's shared parts (the tools and schemas the planner builds once per shape) are
redacted once per shape, and the file is byte for byte what redacting it whole writes."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from toolforge.core.redact import REDACTED, redact_serialisable, remember_secrets
from toolforge.runtime.artifacts import ArtifactStore

# One shape's parts, shared by every stream of that shape.
TOOLS: list[dict[str, object]] = [
    {
        "name": "places.search",
        "description": "Find places; token sk-abcdef123456 must not leak",
        "input_schema": {"type": "object", "properties": {"api_key": {"type": "string"}}},
    }
]
SCHEMAS: dict[str, object] = {"Place": {"type": "object", "password": "hunter22hunter"}}


def prompt(text: str) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "schemas": SCHEMAS,
        "tools": TOOLS,
        "ssn": "123-45-6789",
        "sampling": {"max_tokens": 9},
    }


async def write(store: ArtifactStore, stream_id: str, text: str) -> bytes:
    directory = await store.run(stream_id).write(
        frames=[], prompt=prompt(text), result={}, tool_logs=[], metrics={}
    )
    return (directory / "prompt.json").read_bytes()


def whole(store: ArtifactStore, text: str) -> bytes:
    """prompt.json as redacting the prompt in one walk writes it."""
    value = redact_serialisable(prompt(text), extra_keys=store.all_keys)
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


async def test_the_file_is_what_one_walk_writes_on_every_stream(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, redact_keys=["ssn"])
    for i, text in enumerate(["first", "second, with gsk_abcdef123456"]):
        assert await write(store, f"s{i}", text) == whole(store, text)
    doc = json.loads(await write(store, "s9", "third"))
    assert list(doc) == ["model", "messages", "schemas", "tools", "ssn", "sampling"]
    assert doc["ssn"] == REDACTED and doc["schemas"]["Place"]["password"] == REDACTED
    assert "sk-abcdef123456" not in json.dumps(doc)


async def test_a_secret_remembered_later_is_redacted_in_the_shared_parts(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    secret = "zq-shared-part-secret-7f3a9c"
    TOOLS.append({"name": "later", "description": f"uses {secret}", "input_schema": {}})
    try:
        # Cached with the new tool in it, before the secret is known.
        assert secret in (await write(store, "s1", "a")).decode()
        remember_secrets([secret])
        text = (await write(store, "s2", "b")).decode()
        assert secret not in text and REDACTED in text
    finally:
        TOOLS.pop()


async def test_a_redaction_key_naming_a_shared_part_redacts_it_whole(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, tool_redact_keys={"places.search": ["Tools"]})
    doc = json.loads(await write(store, "s1", "x"))
    assert doc["tools"] == REDACTED
    assert await write(store, "s2", "x") == whole(store, "x")
