"""The frames' JSON Schemas, generated from the typed frames (:mod:`.frames`). No I/O.

Two shapes, for two readers:

* :func:`frame_schema` — one event's ``data`` object, self-contained: what
  ``schemas/frames/<event>.json`` holds (``python -m toolforge.tools.export_schemas`` writes them)
  and what the conformance checks validate every frame against.
* :func:`stream_event_definitions` — every ``data`` object plus the SSE events around
  them (``{"id", "event", "data"}``, as ``frames.ndjson`` and SSE clients see them) and
  ``StreamEvent``, their union discriminated by ``event``: ``schemas/frames/frames.json``
  and the components of the OpenAPI document.

The schemas say what goes on the wire, which the classes alone do not: a field whose
default is ``None`` is absent unless set, so it is optional and never ``null``; every
object the gateway builds is closed (``additionalProperties: false``); properties carry
no generated titles (a client generator would turn each into a type).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import core_schema

from toolforge.core.protocol.frames import EVENTS, PING, Frame

__all__ = ["JSON_SCHEMA_DIALECT", "STREAM_EVENT", "frame_schema", "stream_event_definitions"]

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
STREAM_EVENT: Final = "StreamEvent"
"""The name of the union of every SSE event, in :func:`stream_event_definitions`."""


class _WireSchema(GenerateJsonSchema):
    """pydantic's generator, with the two wire rules of the module docstring."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default", ...) is not None:
            return super().default_schema(schema)
        inner = schema["schema"]
        if inner["type"] == "nullable":
            inner = inner["schema"]
        return self.generate_inner(inner)


def frame_schema(cls: type[Frame]) -> dict[str, Any]:
    """The JSON Schema of ``cls``'s ``data`` object, with the definitions it uses."""
    schema = TypeAdapter(cls).json_schema(schema_generator=_WireSchema)
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def stream_event_definitions(ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
    """Named schemas: each frame's ``data`` (by class name), the objects inside them, one
    ``<Class>Event`` per SSE event and :data:`STREAM_EVENT`, the union of the events.

    ``ref_template`` is where the names live: ``#/$defs/{model}`` in a JSON Schema
    document, ``#/components/schemas/{model}`` in OpenAPI.
    """
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]] = [
        (event, "validation", TypeAdapter(cls)) for event, cls in EVENTS.items()
    ]
    refs, top = TypeAdapter.json_schemas(
        inputs, ref_template=ref_template, schema_generator=_WireSchema
    )
    definitions: dict[str, Any] = dict(top.get("$defs", {}))
    mapping: dict[str, str] = {}
    for (event, _), data_ref in refs.items():
        cls = EVENTS[event]
        name = f"{cls.__name__}Event"
        definitions[name] = _event_schema(cls, data_ref)
        mapping[event] = ref_template.format(model=name)
    definitions[STREAM_EVENT] = {
        "title": STREAM_EVENT,
        "description": "One server-sent event of a stream (docs/protocol.md), by its event name.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "event", "mapping": mapping},
    }
    return definitions


def _event_schema(cls: type[Frame], data_ref: Mapping[str, Any]) -> dict[str, Any]:
    """``{"id", "event", "data"}``: the SSE fields of one event. Pings have no ``id``."""
    properties: dict[str, Any] = {
        "id": {"type": "integer", "minimum": 1, "description": "the stream's sequence number"},
        "event": {"const": cls.event},
        "data": dict(data_ref),
    }
    required = ["id", "event", "data"]
    if cls.event == PING:
        del properties["id"]
        required.remove("id")
    return {
        "title": f"{cls.__name__}Event",
        "description": f"The ``{cls.event}`` event.",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
