"""A workflow run's answer, as every wire format but ``/v1/stream``'s own gives it. Pure.

A workflow run (``toolforge.workflow``) answers with its terminal tool's result: the model's
text between calls is not the answer (it stays in the artifacts), and the last
``result.end`` — the gateway's, for the terminal tool that ended the run — is, as a
``respond`` call's ``content`` words or as JSON. The formats hold the text back while the
run goes on and write this answer at its ``done`` (docs/responses.md, docs/agui.md,
docs/ui-stream.md). :func:`answer_text` is that rule, once; :class:`WorkflowAnswer` applies it
to a stream's frames for the Chat Completions, Responses, AG-UI and UI-stream writers alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from toolforge.core.protocol.frames import RESULT_BEGIN, RESULT_END, TEXT_DELTA
from toolforge.core.workflow import RESPOND

__all__ = ["HELD", "WorkflowAnswer", "answer_text"]

# The frames a workflow run's writer holds back (and gives to WorkflowAnswer.frame).
HELD: Final = frozenset({TEXT_DELTA, RESULT_BEGIN, RESULT_END})


def answer_text(schema: str | None, value: object) -> str:
    """The answer a ``result.end`` of ``schema`` carrying ``value`` gives: a ``respond``
    call's ``content`` words, else the value as JSON text."""
    said = value.get("content") if isinstance(value, dict) else None
    if schema == RESPOND and isinstance(said, str):
        return said
    return orjson.dumps(value).decode()


class WorkflowAnswer:
    """The answer so far: ``text`` is None until a ``result.end`` came."""

    __slots__ = ("_schemas", "text")

    def __init__(self) -> None:
        self._schemas: dict[str, str] = {}
        self.text: str | None = None

    def frame(self, event: str, data: Mapping[str, Any]) -> None:
        """One held frame."""
        if event == RESULT_BEGIN:
            self._schemas[data["id"]] = data["schema"]
        elif event == RESULT_END:
            self.text = answer_text(self._schemas.get(data["id"]), data["value"])
