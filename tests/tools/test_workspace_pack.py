"""The workspace pack (docs/tools.md): facts change only after a person confirms through the
approvals endpoint; the draft respects locks; every change is audited.

From the store, through the executor, and through a whole stream on loopback (a scripted
model proposes a fact; the gateway asks for the hidden facts.commit; the test approves or
denies it over HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from tests.api.conftest import (
    Harness,
    HarnessFactory,
    assert_well_formed,
    frames,
    sentinel_reply,
)
from tests.api.test_tools import call, named, tokens
from toolforge.core.tool_rules import ToolConfigError, check_registry
from toolforge.core.tool_specs import PermanentToolError, ToolRegistry, ToolSpec
from toolforge.errors import ErrorCode
from toolforge.runtime.executor import ToolExecutor, ToolResult
from toolforge.settings import Settings
from toolforge.tools import load_packs
from toolforge.tools.workspace import COMMIT, PROPOSE, Workspace, pack_tools

NAME = {"key": "guest.name", "value": "Ada", "reason": "the user said so"}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws.sqlite")


def registry(ws: Workspace) -> ToolRegistry:
    reg = ToolRegistry(pack_tools(Settings(), workspace=ws))
    check_registry(reg)
    return reg


# -- the store ------------------------------------------------------------------------------


def test_propose_changes_no_fact_and_commit_takes_exactly_the_proposal(ws: Workspace) -> None:
    p = ws.propose("guest.name", "Ada", "asked")
    assert ws.snapshot("facts") == {"facts": {}}
    assert ws.snapshot("proposals")["pending"][0]["proposal_id"] == p["proposal_id"]
    with pytest.raises(PermanentToolError) as tampered:
        ws.commit(p["proposal_id"], "guest.name", "Eve")
    assert tampered.value.code is ErrorCode.PROPOSAL_INVALID
    with pytest.raises(PermanentToolError):
        ws.commit(p["proposal_id"], "guest.email", "Ada")
    done = ws.commit(p["proposal_id"], "guest.name", "Ada")
    assert done["before"] is None and ws.snapshot("facts") == {"facts": {"guest.name": "Ada"}}
    with pytest.raises(PermanentToolError, match="committed, not pending"):
        ws.commit(p["proposal_id"], "guest.name", "Ada")  # once only
    with pytest.raises(PermanentToolError, match="no proposal"):
        ws.commit("p_nope", "guest.name", "Ada")


def test_a_new_proposal_supersedes_the_pending_one(ws: Workspace) -> None:
    first = ws.propose("party.size", 2, "asked")
    second = ws.propose("party.size", 4, "corrected")
    assert [p["value"] for p in ws.snapshot("proposals")["pending"]] == [4]
    with pytest.raises(PermanentToolError, match="superseded"):
        ws.commit(first["proposal_id"], "party.size", 2)
    ws.commit(second["proposal_id"], "party.size", 4)
    assert ws.snapshot("facts", "party.size") == {"facts": {"party.size": 4}}


def test_locks_stop_draft_edits_and_proposals_until_unlocked(ws: Workspace) -> None:
    ws.set_draft("title", "v1")
    pending = ws.propose("title", "T", "r")
    ws.lock("title", "signed off")
    for attempt in (
        lambda: ws.set_draft("title", "v2"),
        lambda: ws.propose("title", "T2", "r"),
        lambda: ws.commit(pending["proposal_id"], "title", "T"),  # locked after proposing
    ):
        with pytest.raises(PermanentToolError, match="signed off") as refused:
            attempt()
        assert refused.value.code is ErrorCode.WORKSPACE_LOCKED
    assert ws.snapshot("draft") == {"draft": {"title": "v1"}}
    assert ws.snapshot("locks") == {"locks": {"title": "signed off"}}
    assert ws.unlock("title") and not ws.unlock("title")
    ws.set_draft("title", "v2")
    ws.set_draft("other", "x")
    ws.set_draft("other", None)  # null removes
    assert ws.snapshot("draft") == {"draft": {"title": "v2"}}


def test_every_change_is_audited_with_its_actor(ws: Workspace) -> None:
    ws.set_draft("a", 1)
    p = ws.propose("b", 2, "because")
    ws.commit(p["proposal_id"], "b", 2)
    ws.lock("a", "done")
    with pytest.raises(PermanentToolError):
        ws.set_draft("a", 3)  # refused: not a change, not audited
    ws.unlock("a")
    log = ws.audit()
    assert [(e["actor"], e["action"], e["key"]) for e in log] == [
        ("model", "draft.set", "a"),
        ("model", PROPOSE, "b"),
        ("user", COMMIT, "b"),
        ("user", "lock", "a"),
        ("user", "unlock", "a"),
    ]
    assert log[2]["before"] is None and log[2]["after"] == 2
    assert log[2]["proposal_id"] == p["proposal_id"] == log[1]["proposal_id"]
    assert [e["seq"] for e in log] == sorted(e["seq"] for e in log)


def test_state_is_in_the_file_shared_by_every_opener(tmp_path: Path) -> None:
    one, two = Workspace(tmp_path / "w.sqlite"), Workspace(tmp_path / "w.sqlite")
    one.lock("k", "x")
    with pytest.raises(PermanentToolError):
        two.set_draft("k", 1)


# -- the rules and the executor ----------------------------------------------------------------


class _Args(BaseModel):
    x: int = 0


async def _noop(args: _Args) -> dict[str, int]:
    return {"x": args.x}


def _spec(name: str, **kw: Any) -> ToolSpec[Any]:
    return ToolSpec(
        name=name, description="d", args_model=_Args, fn=_noop, output_allowlist={"*"}, **kw
    )


@pytest.mark.parametrize(
    ("commit", "problem"),
    [
        (None, "is not a registered tool"),
        (_spec("c", needs_approval=True), "is model-facing"),
        (_spec("c", model_facing=False), "does not need approval"),
    ],
)
def test_a_confirming_tool_must_be_hidden_and_approval_gated(
    commit: ToolSpec[Any] | None, problem: str
) -> None:
    specs = [_spec("p", confirm_with="c")] + ([commit] if commit else [])
    with pytest.raises(ToolConfigError, match=problem):
        check_registry(specs)


def test_the_pack_loads_by_configuration(tmp_path: Path) -> None:
    reg = load_packs(Settings(tool_packs="demo,workspace", workspace_db=tmp_path / "w.sqlite"))
    shown = [t.name for t in reg.visible(None)]
    assert shown == ["places.search", "bookings.create", "workspace.get", "draft.set", PROPOSE]
    assert (tmp_path / "w.sqlite").is_file()


def code(result: ToolResult) -> object:
    assert not result.ok
    return result.envelope.errors[0]["code"]


async def test_commit_is_refused_to_the_model_and_without_approval(ws: Workspace) -> None:
    ex = ToolExecutor(registry(ws), approval_timeout_s=0.2)
    p = await ex.run(PROPOSE, NAME, call_id="c1")
    assert p.ok
    args = p.envelope.data
    # The model naming it: hidden tools do not run.
    as_model = await ex.run(COMMIT, args, call_id="c2")
    assert code(as_model) == "TOOL_NOT_ALLOWED"
    # The gateway's confirming call, with no one to approve, then denied, then too late.
    nobody = await ex.run(COMMIT, args, call_id="c3", confirming=True)
    assert code(nobody) == "TOOL_APPROVAL_DENIED"

    async def deny() -> bool:
        return False

    async def never() -> bool:
        await asyncio.sleep(5)
        return True

    denied = await ex.run(COMMIT, args, call_id="c4", confirming=True, approval=deny)
    assert code(denied) == "TOOL_APPROVAL_DENIED"
    late = await ex.run(COMMIT, args, call_id="c5", confirming=True, approval=never)
    assert code(late) == "TOOL_APPROVAL_TIMEOUT"
    # The confirming flag opens no other tool.
    other = await ex.run("draft.set", {"key": "a", "value": 1}, call_id="c6", confirming=True)
    assert code(other) == "TOOL_NOT_ALLOWED"
    assert ws.snapshot("facts") == {"facts": {}}

    async def grant() -> bool:
        return True

    granted = await ex.run(COMMIT, args, call_id="c7", confirming=True, approval=grant)
    assert granted.ok and ws.snapshot("facts") == {"facts": {"guest.name": "Ada"}}


# -- through a stream ---------------------------------------------------------------------


async def _approval_call(gw: Harness) -> tuple[str, dict[str, Any]]:
    """The stream that waits, and the tool.call of the gateway's confirming call."""
    async with asyncio.timeout(5):
        while True:
            running = [s for s, sess in gw.gateway.registry._sessions.items() if sess.running]
            if running:
                break
            await asyncio.sleep(0.01)
    stream_id = running[0]
    session = gw.gateway.registry.get(stream_id)
    seen = b""
    async with asyncio.timeout(5), contextlib.aclosing(session.log.follow(0)) as batches:
        async for batch in batches:
            seen += batch
            for block in seen.split(b"\n\n"):
                lines = block.split(b"\n")
                if b"event: tool.call" in lines:
                    data = orjson.loads(next(x for x in lines if x.startswith(b"data: "))[6:])
                    if data["name"] == COMMIT:
                        return stream_id, data
    raise AssertionError("no confirming call")


@pytest.mark.parametrize("approve", [True, False])
async def test_propose_then_a_person_decides_over_http(
    make_gateway: HarnessFactory, ws: Workspace, approve: bool
) -> None:
    script = [tokens(call("t1", PROPOSE, NAME)), tokens(sentinel_reply("Noted."))]
    gw = await make_gateway(script, tools=registry(ws))
    reading = asyncio.create_task(gw.stream({"input": "My name is Ada."}))
    stream_id, confirm = await _approval_call(gw)
    assert confirm["needs_approval"] is True and confirm["id"] != "t1"
    assert confirm["args"]["key"] == "guest.name" and confirm["args"]["value"] == "Ada"
    assert ws.snapshot("facts") == {"facts": {}}  # nothing before the person answers
    answer = await gw.client.post(
        f"{gw.url}/v1/streams/{stream_id}/approvals/{confirm['id']}", json={"approve": approve}
    )
    assert answer.status_code == 200
    events = await reading
    assert_well_formed(events)
    calls = named(events, "tool.call")
    results = named(events, "tool.result")
    assert [c["name"] for c in calls] == [PROPOSE, COMMIT]
    assert [r["ok"] for r in results] == [True, approve]
    # The model hears the outcome in its proposal's result, and is never shown the tool.
    resumed = orjson.dumps(gw.upstream.requests[1].json["messages"]).decode()
    assert f'\\"confirmed\\":{str(approve).lower()}' in resumed
    assert COMMIT not in orjson.dumps(gw.upstream.requests[0].json).decode()
    if approve:
        assert ws.snapshot("facts") == {"facts": {"guest.name": "Ada"}}
        assert [e["action"] for e in ws.audit()] == [PROPOSE, COMMIT]
    else:
        assert results[1]["error"]["code"] == "TOOL_APPROVAL_DENIED"
        assert ws.snapshot("facts") == {"facts": {}}
        assert ws.snapshot("proposals")["pending"][0]["value"] == "Ada"
        assert [e["action"] for e in ws.audit()] == [PROPOSE]
    assert [e.event for e in frames(events)][-1] == "done"


async def test_a_model_that_calls_commit_itself_is_refused(
    make_gateway: HarnessFactory, ws: Workspace
) -> None:
    p = ws.propose("guest.name", "Mallory", "sneaky")
    forged = {**p}
    script = [tokens(call("t1", COMMIT, forged)), tokens(sentinel_reply("ok"))]
    gw = await make_gateway(script, tools=registry(ws))
    events = await gw.stream({"input": "commit it"})
    (result,) = named(events, "tool.result")
    assert result["ok"] is False
    assert result["error"]["code"] in {"TOOL_NOT_ALLOWED", "TOOL_NOT_FOUND"}
    assert ws.snapshot("facts") == {"facts": {}}
    listed = (await gw.client.get(f"{gw.url}/v1/tools")).json()["tools"]
    by_name = {t["name"]: t for t in listed}
    assert by_name[PROPOSE]["confirm_with"] == COMMIT
    assert COMMIT not in by_name or by_name[COMMIT]["model_facing"] is False


def test_the_cli_shows_locks_and_audits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolforge.cli import main

    db = tmp_path / "w.sqlite"
    Workspace(db).set_draft("title", "v1")
    main(["workspace", "lock", "title", "--reason", "final", "--db", str(db)])
    main(["workspace", "show", "--db", str(db)])
    main(["workspace", "audit", "--db", str(db)])
    out = capsys.readouterr().out
    assert "locked title" in out and '"title": "final"' in out
    actions = [orjson.loads(x)["action"] for x in out.splitlines() if x.startswith('{"seq"')]
    assert actions == ["draft.set", "lock"]
    with pytest.raises(PermanentToolError):
        Workspace(db).set_draft("title", "v2")
    with pytest.raises(SystemExit):
        main(["workspace", "unlock", "--db", str(db)])  # no key
    main(["workspace", "unlock", "title", "--db", str(db)])
    Workspace(db).set_draft("title", "v2")


async def test_bad_keys_and_huge_values_are_argument_errors(ws: Workspace) -> None:
    ex = ToolExecutor(registry(ws))
    for args in (
        {"key": "../etc", "value": 1},
        {"key": "", "value": 1},
        {"key": "a b", "value": 1},
        {"key": "big", "value": "x" * 20_000},
        {"key": "k", "value": 1, "workspace_id": "other"},  # one workspace, never named
    ):
        result = await ex.run("draft.set", args, call_id="c")
        assert code(result) == "TOOL_ARGS_INVALID", args
    assert ws.snapshot("draft") == {"draft": {}} and ws.audit() == []
