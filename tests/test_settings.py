"""Settings come from docs/deployment.md's environment variables; constructor arguments override."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolforge.settings import Settings


def test_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UPSTREAM_BASE_URL", "GROQ_BASE_URL", "UPSTREAM_API_KEY", "GROQ_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert s.upstream_base_url is None  # the embedded llama-server (docs/servers.md)
    assert (s.ping_interval_s, s.queue_max_frames, s.resume_ttl_s) == (15.0, 128, 300.0)
    assert (s.max_frame_bytes, s.max_json_depth, s.max_body_bytes) == (65536, 16, 1048576)
    assert (s.frame_timeout_ms, s.tool_timeout_ms, s.repair_retries) == (15000, 8000, 1)
    assert (s.upstream_preconnect, s.llama_nice) == (True, 10)


def test_environment_names_of_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_BASE_URL", "http://up:1/v1")
    monkeypatch.setenv("UPSTREAM_API_KEY", "sk-secret")
    monkeypatch.setenv("MODEL_ID", "m")
    monkeypatch.setenv("PING_INTERVAL_S", "2.5")
    monkeypatch.setenv("QUEUE_MAX_FRAMES", "16")
    monkeypatch.setenv("ARTIFACTS_DIR", "/tmp/x")
    monkeypatch.setenv("UPSTREAM_PRECONNECT", "false")
    monkeypatch.setenv("LLAMA_NICE", "0")
    s = Settings()
    assert (s.upstream_preconnect, s.llama_nice) == (False, 0)
    assert (s.upstream_base_url, s.upstream_api_key, s.model_id) == (
        "http://up:1/v1",
        "sk-secret",
        "m",
    )
    assert (s.ping_interval_s, s.queue_max_frames, s.artifacts_dir) == (2.5, 16, Path("/tmp/x"))
    assert "sk-secret" not in repr(s)


def test_groq_names_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPSTREAM_BASE_URL", raising=False)
    monkeypatch.delenv("UPSTREAM_API_KEY", raising=False)
    monkeypatch.setenv("GROQ_BASE_URL", "https://groq.example/openai/v1")
    monkeypatch.setenv("GROQ_API_KEY", "gsk_abc")
    s = Settings()
    assert (s.upstream_base_url, s.upstream_api_key) == (
        "https://groq.example/openai/v1",
        "gsk_abc",
    )


def test_arguments_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_ID", "from-env")
    assert Settings(model_id="from-flag").model_id == "from-flag"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("QUEUE_MAX_FRAMES", "0"),
        ("PING_INTERVAL_S", "-1"),
        ("LLAMA_NICE", "-1"),  # raising priority needs privileges; the server's is lowered
        ("LLAMA_NICE", "20"),  # Linux nice ends at 19
        ("UPSTREAM_PRECONNECT", "sometimes"),
    ],
)
def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        Settings()
