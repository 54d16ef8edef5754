"""What content an upstream takes in a message besides text, by its kind. Pure.

A front door that accepts images or files (the Responses API's ``input_image`` and
``input_file`` parts) passes them on as Chat Completions parts (``image_url``, ``file``)
only to an upstream that can take them, and refuses them by name otherwise, before any
model call: an adapter that cannot carry a part would drop it silently (Anthropic's sends
text blocks, Ollama's native chat a content string), and a server without the means to
read it answers with an error the client cannot act on (llama-server without a
multimodal projector).

Two facts per ``UPSTREAM_KIND`` (docs/responses.md, "Images and files"):

- what its adapter **carries**: the OpenAI-compatible and llama-server adapters send the
  parts as they are; the Ollama and Anthropic adapters send text only;
- what its server **takes by default**: an OpenAI-compatible server everything (a model
  that cannot read a part says so itself); llama-server text only, since the embedded one
  runs without a projector. ``UPSTREAM_INPUT`` declares what a server takes instead (a
  llama-server started with ``--mmproj``: ``text,image``), within what its adapter carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from toolforge.errors import ErrorCode, RequestError

__all__ = ["CONTENT_KINDS", "PART_KINDS", "accepted_input", "check_messages", "check_parts"]

# The kinds of content, as UPSTREAM_INPUT names them.
CONTENT_KINDS: Final = ("text", "image", "file")
# A Chat Completions content part's type -> its kind.
PART_KINDS: Final[Mapping[str, str]] = MappingProxyType(
    {"text": "text", "image_url": "image", "file": "file"}
)

_ALL: Final = frozenset(CONTENT_KINDS)
_TEXT: Final = frozenset({"text"})
_CARRIES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {"openai": _ALL, "llama_server": _ALL, "ollama": _TEXT, "anthropic": _TEXT}
)
_TAKES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {"openai": _ALL, "llama_server": _TEXT, "ollama": _TEXT, "anthropic": _TEXT}
)


def accepted_input(kind: str, declared: str | None = None) -> frozenset[str]:
    """The content kinds an upstream of ``kind`` is sent: ``declared`` (``UPSTREAM_INPUT``,
    comma-separated) or the kind's default, within what its adapter carries; text always."""
    takes = (
        frozenset(part.strip() for part in declared.split(",") if part.strip())
        if declared
        else _TAKES.get(kind, _TEXT)
    )
    return (takes & _CARRIES.get(kind, _TEXT)) | _TEXT


def check_parts(
    parts: object,
    field: str,
    accepts: frozenset[str],
    upstream: str,
    kinds: Mapping[str, str] = PART_KINDS,
    *,
    kind_of: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> None:
    """Refuse the first part of ``parts`` (a message's content, at ``field``) whose kind
    the upstream (``UPSTREAM_KIND`` ``upstream``) is not sent: it takes only the kinds in
    ``accepts`` (:func:`accepted_input`). ``kinds`` maps a part's type to its kind
    (Chat Completions' by default; the Responses API passes its ``input_image`` and
    ``input_file``, AG-UI its ``image`` and ``document``); a type it does not name is not
    this check's to judge. ``kind_of``, where a format's type alone does not say the kind
    (the AI SDK's ``file`` part is an image by its ``mediaType``), reads it from the part
    instead. A string content, or anything not a list, passes. The 400 names the part:
    ``field[j]``."""
    if not isinstance(parts, Sequence) or isinstance(parts, str):
        return
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            continue
        kind = kind_of(part) if kind_of is not None else kinds.get(str(part.get("type")))
        if kind is not None and kind not in accepts:
            place = f"{field}[{j}]"
            message = (
                f"{part['type']} content cannot go to this upstream (UPSTREAM_KIND={upstream}), "
                f"which takes {', '.join(sorted(accepts))} only: send it as text, or use a "
                f"model server that reads {kind}s (UPSTREAM_INPUT declares what the server "
                "takes)"
            )
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"invalid '{place}': {message}",
                details=[{"field": place, "message": message}],
                http_status=400,
            )


def check_messages(
    messages: Sequence[Mapping[str, Any]], accepts: frozenset[str], upstream: str
) -> None:
    """:func:`check_parts` over Chat Completions messages: the first image or file part
    the upstream is not sent is refused as ``messages[i].content[j]``."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):  # the common case, a string, costs one check
            check_parts(content, f"messages[{i}].content", accepts, upstream)
