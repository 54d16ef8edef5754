"""What each kind of upstream is sent besides text: its default, what UPSTREAM_INPUT
declares, never more than its adapter carries."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from unittest.mock import ANY

import pytest

from toolforge.core.input_content import PART_KINDS, accepted_input, check_parts
from toolforge.errors import RequestError

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


def _by_media_type(part: Mapping[str, Any]) -> str | None:
    return "image" if str(part.get("mediaType", "")).startswith("image/") else None


@pytest.mark.parametrize(
    ("parts", "kinds", "kind_of", "refused"),
    [
        ([{"type": "text"}, {"type": "image_url"}], PART_KINDS, None, "field[1]"),
        ([{"type": "image"}, {"type": "input_image"}], {"input_image": "image"}, None, "field[1]"),
        ([{"type": "image"}], {"input_image": "image"}, None, None),  # not its to judge
        ([{"type": "file", "mediaType": "text/plain"}], PART_KINDS, _by_media_type, None),
        ([{"type": "file", "mediaType": "image/png"}], PART_KINDS, _by_media_type, "field[0]"),
        ("a string", PART_KINDS, None, None),
        (["not a part", {"type": "file"}], PART_KINDS, None, "field[1]"),
    ],
)
def test_check_parts_refuses_the_first_part_by_its_place(
    parts: object,
    kinds: Mapping[str, str],
    kind_of: Callable[[Mapping[str, Any]], str | None] | None,
    refused: str | None,
) -> None:
    if refused is None:
        check_parts(parts, "field", TEXT, "llama_server", kinds, kind_of=kind_of)
        return
    with pytest.raises(RequestError) as caught:
        check_parts(parts, "field", TEXT, "llama_server", kinds, kind_of=kind_of)
    assert caught.value.details == [{"field": refused, "message": ANY}]
    assert caught.value.http_status == 400
