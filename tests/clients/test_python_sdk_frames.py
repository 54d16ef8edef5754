"""The SDK's typed frames (clients/python/src/toolforge_client/frames.py) are generated
from schemas/frames/*.json by clients/python/scripts/generate_frames.py: the committed
file must be what the script writes for the committed schemas."""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import ValidationError

import toolforge_client
from toolforge.core.protocol.frames import EVENTS
from toolforge_client import frames

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "clients" / "python" / "scripts" / "generate_frames.py"
REGENERATE = "python clients/python/scripts/generate_frames.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_frames", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_frames_match_the_schemas() -> None:
    gen = generator()
    assert gen.SCHEMAS == ROOT / "schemas" / "frames"
    committed = gen.OUTPUT.read_text(encoding="utf-8")
    assert committed == gen.render(), f"frames.py is stale: run `{REGENERATE}` and commit it"
    assert gen.main(["--check"]) == 0


def test_a_schema_change_is_detected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = generator()
    schemas = tmp_path / "frames"
    shutil.copytree(gen.SCHEMAS, schemas)
    path = schemas / "text.delta.json"
    schema = json.loads(path.read_text())
    schema["properties"]["lang"] = {"type": "string"}
    path.write_text(json.dumps(schema))
    out = tmp_path / "frames.py"
    out.write_text(gen.OUTPUT.read_text())
    assert gen.main(["--check", "--schemas", str(schemas), "--output", str(out)]) == 1
    assert "stale" in capsys.readouterr().err
    assert gen.main(["--schemas", str(schemas), "--output", str(out)]) == 0
    assert "    lang: str | None = None" in out.read_text()
    assert gen.main(["--check", "--schemas", str(schemas), "--output", str(out)]) == 0


def test_every_event_has_a_model_that_reads_its_frames() -> None:
    assert set(frames.FRAME_TYPES) == set(EVENTS)
    for event, model in frames.FRAME_TYPES.items():
        assert model.EVENT == event
    begin = frames.JsonBegin.model_validate({"id": "o1", "schema": "Action"})
    assert begin.schema_ == "Action"
    call = frames.ToolCall.model_validate(
        {"id": "t1", "name": "x", "args": {}, "executor": "client", "new_key": 1}
    )
    assert call.executor == "client" and call.model_extra == {"new_key": 1}  # lenient
    with pytest.raises(ValidationError):
        frames.ToolCall.model_validate({"id": "t1"})
    assert "CLIENT_TOOL_TIMEOUT" in frames.ERROR_CODES


def test_every_sdk_module_declares_its_surface() -> None:
    names = [m.name for m in pkgutil.walk_packages(toolforge_client.__path__, "toolforge_client.")]
    assert "toolforge_client.frames" in names
    for name in ["toolforge_client", *names]:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} has no __all__"
        assert [a for a in exported if not hasattr(module, a)] == [], name
