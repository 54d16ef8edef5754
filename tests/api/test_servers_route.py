"""GET /v1/servers and the backends started behind it (docs/servers.md): a plain remote upstream
manages nothing; UPSTREAM_KIND=ollama sizes, loads and reports the model through Ollama's
HTTP API (a scripted Ollama on loopback, answering with the documented shapes); the
embedded llama-server is in tests/integration."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.api.conftest import HarnessFactory
from toolforge.api.app import create_app
from toolforge.errors import ErrorCode, ServerError
from toolforge.eval.scripted_upstream import Script, Step
from toolforge.settings import Settings

FIXTURES = Path(__file__).parents[1] / "upstream" / "fixtures" / "ollama"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def ollama_routes() -> dict[str, Script]:
    return {
        "/api/show": Script(end="status", body=fixture("show.json")),
        "/api/generate": Script(end="status", body=fixture("generate_load.json")),
        "/api/ps": Script(end="status", body=fixture("ps.json")),
        "/api/chat": Script(steps=(Step(raw=fixture("chat_text.ndjson")),), end="eof"),
    }


async def test_a_remote_upstream_manages_nothing(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    body = (await gw.client.get(f"{gw.url}/v1/servers")).json()
    assert body["upstream"] == {
        "base_url": gw.upstream.base_url,
        "kind": "openai",
        "model": "default",
        "managed": False,
    }
    assert body["servers"] == [] and body["budget"] is None


async def test_ollama_is_sized_loaded_and_reported(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        routes=ollama_routes(), upstream_kind="ollama", model_id="qwen3:8b", budget_mode="full"
    )
    body = (await gw.client.get(f"{gw.url}/v1/servers")).json()
    (server,) = body["servers"]
    budget = body["budget"]
    # No GPU here: the CPU decision (4,096 tokens for full), under the trained 40,960.
    assert budget["device"] == "cpu" and budget["budget_tokens"] == 4096
    assert "no NVIDIA GPU" in budget["reason"]
    assert server["backend"] == "ollama" and server["model"] == "qwen3:8b"
    assert server["state"] == "loaded" and server["num_ctx"] == 4096
    assert server["context_length"] == 32768  # what /api/ps says Ollama allocated
    load = next(r for r in gw.upstream.all_requests if r.path == "/api/generate")
    assert load.json["options"] == {"num_ctx": 4096} and load.json["keep_alive"] == "30m"

    events = await gw.stream({"input": "ramen?", "mode": "sentinel"})
    assert events[-1].event == "done"
    chat = next(r for r in gw.upstream.all_requests if r.path == "/api/chat")
    assert chat.json["options"]["num_ctx"] == 4096  # the same num_ctx: no reload


async def test_ollama_clamps_the_budget_to_the_trained_context(
    make_gateway: HarnessFactory,
) -> None:
    routes = ollama_routes()
    show = orjson.loads(fixture("show.json"))
    show["model_info"]["qwen3.context_length"] = 2048
    routes["/api/show"] = Script(end="status", body=orjson.dumps(show).decode())
    gw = await make_gateway(routes=routes, upstream_kind="ollama", model_id="qwen3:8b")
    body = (await gw.client.get(f"{gw.url}/v1/servers")).json()
    assert body["servers"][0]["num_ctx"] == 2048
    assert "trained context of 2,048" in body["budget"]["reason"]


async def test_ollama_without_a_model_id_fails_at_start(tmp_path: Path) -> None:
    settings = Settings(
        upstream_base_url="http://127.0.0.1:9/v1", upstream_kind="ollama", artifacts_dir=tmp_path
    )
    app = create_app(settings)
    with pytest.raises(ServerError, match="needs MODEL_ID") as caught:
        async with app.router.lifespan_context(app):
            pass
    assert caught.value.code is ErrorCode.BACKEND_SETUP_FAILED
