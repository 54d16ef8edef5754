"""StreamSession in constrained mode: each turn's request carries the grammar of the ids it
may use, the model repair call a JSON-only grammar; everything else is sentinel mode."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from pathlib import Path

from tests.core.gbnf_matcher import parse
from toolforge.core.engine import ConstrainedMode, SentinelMode
from toolforge.core.gbnf import FrameGrammar
from toolforge.core.schemas import AssistantReply, builtin_registry, model_schema
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.planner import SessionLimits, StreamPlan
from toolforge.runtime.session import StreamSession
from toolforge.tools import default_registry
from toolforge.tools.places import PlacesSearchArgs
from toolforge.upstream.base import ChatRequest, UpstreamDelta

L, R = "\u27e6", "\u27e7"
REPAIR = (Path(__file__).resolve().parents[2] / "prompts" / "repair.txt").read_text("utf-8")


class RecordingUpstream:
    """Answers each request with the next scripted text, and keeps the requests."""

    def __init__(self, replies: Iterable[str]) -> None:
        self.replies = list(replies)
        self.requests: list[ChatRequest] = []

    async def stream(self, request: ChatRequest) -> AsyncGenerator[UpstreamDelta, None]:
        self.requests.append(request)
        yield UpstreamDelta(self.replies.pop(0))
        yield UpstreamDelta("", finish_reason="stop")


def grammar() -> FrameGrammar:
    return FrameGrammar(
        tools={"places.search": PlacesSearchArgs.model_json_schema()},
        result=("AssistantReply", model_schema(AssistantReply)),
    )


def call(call_id: str) -> str:
    begin = f"{L}BEGIN_TOOL_CALL id={call_id} name=places.search{R}"
    return begin + '{"query": "pizza"}' + f"{L}END_TOOL_CALL id={call_id}{R}"


def reply(body: str = '{"answer": "ok"}', rid: str = "r1") -> str:
    return f"{L}BEGIN_RESULT id={rid} schema=AssistantReply{R}{body}{L}END_RESULT id={rid}{R}"


async def run(
    upstream: RecordingUpstream, plan_grammar: FrameGrammar | None, **plan: object
) -> StreamSession:
    registry = builtin_registry()
    session = StreamSession(
        StreamPlan(
            stream_id="s_test",
            chat=ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}]),
            mode=ConstrainedMode(plan_grammar) if plan_grammar is not None else SentinelMode(),
            schemas={"AssistantReply": registry.get("AssistantReply"), "Any": registry.get("Any")},
            **plan,  # type: ignore[arg-type]
        ),
        upstream=upstream,
        limits=SessionLimits(),
        artifacts=None,
        executor=ToolExecutor(default_registry()),
        repair_template=REPAIR,
    )
    session.start()
    await session.wait()
    return session


async def test_turns_carry_grammars_whose_ids_follow_the_stream() -> None:
    said = [call("t1"), call("t2"), reply()]
    upstream = RecordingUpstream(said)
    session = await run(upstream, grammar())
    assert session.reason == "stop"
    texts = [r.extra["grammar"] for r in upstream.requests]
    assert ["id=t1 " in t for t in texts] == [True, False, False]
    assert ["id=t2 " in t for t in texts] == [False, True, False]
    assert ["id=t3 " in t for t in texts] == [False, False, True]
    for text, turn in zip(texts, said, strict=True):
        assert parse(text).accepts(turn)  # each turn was within its grammar


async def test_the_last_tool_call_leaves_only_the_result() -> None:
    upstream = RecordingUpstream([call("t1"), reply()])
    await run(upstream, grammar(), max_tool_calls=1)
    first, second = (r.extra["grammar"] for r in upstream.requests)
    assert "BEGIN_TOOL_CALL" in first and "BEGIN_TOOL_CALL" not in second


async def test_model_repair_gets_the_json_grammar() -> None:
    upstream = RecordingUpstream([reply('{"answer": 5}'), '{"answer": "five"}'])
    session = await run(upstream, grammar())
    assert session.stats["repairs"] == 1
    turn, repair = upstream.requests
    text = repair.extra["grammar"]
    assert text.startswith("root ::= ") and "BEGIN" not in text
    assert parse(text).accepts('{"answer": "five"}')
    assert repair.temperature == 0.0 and turn.extra["grammar"] != text


async def test_sentinel_mode_sends_no_grammar() -> None:
    upstream = RecordingUpstream([call("t1"), reply('{"answer": 5}'), '{"answer": "five"}'])
    await run(upstream, None)
    assert all("grammar" not in r.extra for r in upstream.requests)
