"""What each kind of upstream is sent besides text: its default, what UPSTREAM_INPUT
declares, never more than its adapter carries."""

from __future__ import annotations

import pytest

from toolforge.core.input_content import accepted_input

ALL = frozenset({"text", "image", "file"})
TEXT = frozenset({"text"})


@pytest.mark.parametrize(
    ("kind", "declared", "accepted"),
    [
        ("openai", None, ALL),
        ("llama_server", None, TEXT),  # the embedded one has no multimodal projector
        ("ollama", None, TEXT),
        ("anthropic", None, TEXT),
        ("llama_server", "text,image", frozenset({"text", "image"})),
        ("openai", " image ", frozenset({"text", "image"})),  # text always
        ("ollama", "text,image,file", TEXT),  # its adapter sends a content string
        ("anthropic", "image", TEXT),  # its adapter sends text blocks
    ],
)
def test_accepted_input(kind: str, declared: str | None, accepted: frozenset[str]) -> None:
    assert accepted_input(kind, declared) == accepted
