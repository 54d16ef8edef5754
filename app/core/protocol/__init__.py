"""The wire protocol's home (docs/protocol.md), sans-IO. Import the module you need:

* :mod:`~toolforge.core.protocol.sentinels` — the syntax models write: the one place that
  renders and recognises ``⟦BEGIN_…⟧`` / ``⟦END_…⟧``;
* :mod:`~toolforge.core.protocol.frames` — what clients receive: one typed value per SSE event,
  its encoding and decoding;
* :mod:`~toolforge.core.protocol.schema` — the frames' JSON Schemas, generated from the typed
  frames (``schemas/frames/``, the OpenAPI document; docs/protocol.md).

Nothing is imported here, so that the tokenizer's ``sentinels`` does not bring pydantic in.
"""

__all__: list[str] = []
