"""bench.llama_grammar measures the grammar a workflow turn really gets: rebuilt from the
stream's prompt.json as the planner builds it, it admits the workflow's legal first call
and nothing a workflow turn may not write (a RESULT frame, free text before the call)."""

from __future__ import annotations

import json
from typing import Any

from bench.llama_grammar import WORKFLOW, turn_grammar
from tests.core.gbnf_matcher import parse
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.schemas import builtin_registry
from toolforge.core.workflow import RESPOND_TOOL
from toolforge.tools import default_registry


def prompt_record() -> dict[str, Any]:
    """The parts of prompt.json the grammar is built from, as the planner records them."""
    schemas = {spec.name: spec.input_schema for spec in default_registry()}
    tools = [{"name": n, "input_schema": schemas[n]} for n in WORKFLOW["tools"] if n in schemas]
    tools.append(dict(RESPOND_TOOL))
    reply = builtin_registry().get("AssistantReply").schema
    return {
        "tools": tools,
        "result_schema": "AssistantReply",
        "schemas": {"AssistantReply": reply},
        "sampling": {"max_tokens": 256},
        "messages": [{"role": "user", "content": "Find an Italian place and book it for two."}],
    }


def call(name: str, args: dict[str, Any], frame_id: str = "t1") -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, json.dumps(args))


def test_the_first_turns_grammar_admits_the_legal_call_and_no_result() -> None:
    grammar = parse(turn_grammar(prompt_record(), max_depth=16))
    assert grammar.accepts(call("places.search", {"query": "italian"}))
    # Not a call: a workflow turn has no RESULT frame and no text before its call.
    result = sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", '{"answer": "hi"}')
    assert not grammar.accepts(result)
    assert not grammar.accepts("Sure! " + call("places.search", {"query": "italian"}))
    # A call must be well-formed and match the tool's schema.
    assert not grammar.accepts(call("places.search", {"q": "italian"}))
    assert not grammar.accepts(call("weather.get", {"query": "italian"}))


def test_the_plain_turn_it_compares_admits_every_tool_and_a_result() -> None:
    grammar = parse(turn_grammar(prompt_record(), max_depth=16, workflow=False))
    result = sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", '{"answer": "hi"}')
    assert grammar.accepts(result)
    assert grammar.accepts(call("places.search", {"query": "italian"}))
    assert grammar.accepts(call("respond", {"content": "No table is free."}))
    assert not grammar.accepts(call("weather.get", {"query": "italian"}))
