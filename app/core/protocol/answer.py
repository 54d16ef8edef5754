"""A workflow run's answer, as every wire format but ``/v1/stream``'s own gives it. Pure.

A workflow run (``toolforge.workflow``) answers with its terminal tool's result: the model's
text between calls is not the answer (it stays in the artifacts), and the last
``result.end`` — the gateway's, for the terminal tool that ended the run — is, as a
``respond`` call's ``content`` words or as JSON. The formats hold the text back while the
run goes on and write this answer at its ``done`` (docs/responses.md, docs/agui.md,
docs/ui-stream.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from toolforge.core.protocol.frames import RESULT_BEGIN, RESULT_END, TEXT_DELTA
from toolforge.core.workflow import RESPOND

__all__ = ["HELD", "WorkflowAnswer"]

# The frames a workflow run's writer holds back (and gives to WorkflowAnswer.frame).
HELD: Final = frozenset({TEXT_DELTA, RESULT_BEGIN, RESULT_END})


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
            value = data["value"]
            said = value.get("content") if isinstance(value, dict) else None
            if self._schemas.get(data["id"]) == RESPOND and isinstance(said, str):
                self.text = said
            else:
                self.text = orjson.dumps(value).decode()
