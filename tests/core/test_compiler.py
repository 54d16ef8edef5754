"""The per-turn compiler (toolforge.core.compiler), pure, as tables: for a workflow state,
which tools are legal, and what each backend's constraint admits — the GBNF (checked with
the test GBNF matcher), the JSON Schema, and the native tools with their tool_choice."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from tests.core.gbnf_matcher import parse
from toolforge.core.chat import ChatRequest
from toolforge.core.compiler import compile_turn
from toolforge.core.decisions import Refuse, Run
from toolforge.core.engine.modes import NativeMode
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar, TurnIds
from toolforge.core.native_tools import to_openai_tools
from toolforge.core.protocol import sentinels
from toolforge.core.provenance import Held, narrow_properties, said_in
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow
from toolforge.errors import RequestError


def _obj(**props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "read_ticket": _obj(ticket_id={"type": "string"}),
    "classify_ticket": _obj(ticket_id={"type": "string"}, category={"type": "string"}),
    "close_ticket": _obj(ticket_id={"type": "string"}, resolution={"type": "string"}),
    "lookup_kb": _obj(query={"type": "string"}),
    "notify": _obj(message={"type": "string"}),
}
TICKETS = parse_workflow(
    {
        "name": "tickets",
        "tools": list(SCHEMAS),
        "required_steps": ["read_ticket", "classify_ticket"],
        "terminal_tools": ["close_ticket"],
        "prerequisites": {"notify": ["lookup_kb"]},
    },
    known_tools=list(SCHEMAS),
)


@pytest.mark.parametrize(
    ("succeeded", "legal"),
    [
        # In order: only the first required step; the terminal waits; a side tool whose
        # arguments only invention could fill (a free query) is no detour before a step
        # that can be made now.
        ((), ["read_ticket"]),
        (("read_ticket",), ["classify_ticket"]),
        (("lookup_kb",), ["read_ticket"]),
        # Every step done: the end is open, what was done leaves the choice, and so does
        # a side tool only invention could fill (the kb's free query, notify's message).
        (("read_ticket", "classify_ticket"), ["close_ticket"]),
        (("read_ticket", "classify_ticket", "lookup_kb"), ["close_ticket"]),
    ],
)
def test_only_the_tools_legal_now_are_offered(succeeded: tuple[str, ...], legal: list[str]) -> None:
    constraint = compile_turn(TICKETS, {}, SCHEMAS, succeeded=succeeded)
    assert list(constraint.tools) == legal
    assert set(constraint.left_out) == set(SCHEMAS) - set(legal)
    assert constraint.call_required


def test_side_tools_are_offered_where_a_step_cannot_be_made_or_their_values_are_held() -> None:
    # The next step needs a value nobody has (narrowed to None): side tools find it, and
    # are called once (a small model loops on them); notify needs the kb by name.
    waiting = {"read_ticket": None}
    assert list(compile_turn(TICKETS, waiting, SCHEMAS, succeeded=()).tools) == ["lookup_kb"]
    constraint = compile_turn(TICKETS, waiting, SCHEMAS, succeeded=("lookup_kb",))
    assert list(constraint.tools) == ["notify"]
    # A side tool whose required arguments are all held values stays a choice beside a
    # step that can be made.
    held = {"lookup_kb": _obj(query={"enum": ["refund"]})}
    constraint = compile_turn(TICKETS, held, SCHEMAS, succeeded=())
    assert list(constraint.tools) == ["read_ticket", "lookup_kb"]


def test_a_done_step_comes_back_while_the_end_cannot_be_called() -> None:
    # The terminal tool needs a value no call produced (narrowed to None): the steps done
    # are offered again, so the run can make that value.
    narrowed = {"close_ticket": None}
    done = ("read_ticket", "classify_ticket", "lookup_kb")
    constraint = compile_turn(TICKETS, narrowed, SCHEMAS, succeeded=done)
    assert list(constraint.tools) == ["read_ticket", "classify_ticket", "lookup_kb", "notify"]
    # Nothing legal at all (every tool narrowed away but one done step): the callable ones.
    only = {t: None for t in SCHEMAS if t != "read_ticket"}
    constraint = compile_turn(TICKETS, only, SCHEMAS, succeeded=("read_ticket",))
    assert list(constraint.tools) == ["read_ticket"]


def _call(name: str, args: dict[str, Any]) -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, "t1", name, orjson.dumps(args).decode())


WEATHER = {
    "get_weather": _obj(city={"type": "string"}),
    "report_weather": _obj(
        city={"type": "string"}, condition={"type": "string"}, temp_c={"type": "integer"}
    ),
}


def _weather_policy() -> WorkflowPolicy:
    wf = parse_workflow(
        {
            "name": "weather",
            "tools": list(WEATHER),
            "required_steps": ["get_weather"],
            "terminal_tools": ["report_weather"],
            "provenance": {"get_weather": {"city": "user"}},
        },
        known_tools=list(WEATHER),
    )
    return WorkflowPolicy(wf, schemas=WEATHER)


def test_the_grammar_admits_the_legal_call_with_grounded_arguments_only() -> None:
    grammar = FrameGrammar(tools=WEATHER, result=("R", {"type": "object"}), max_tokens=256)
    ids = TurnIds("t1", (), "r1")
    p = _weather_policy()
    p.begin_turn([{"role": "user", "content": "What is the weather in Madrid right now?"}])

    def admits(name: str, args: dict[str, Any]) -> bool:
        hints = p.hints()
        g = parse(
            grammar.for_turn(
                ids,
                narrowed=hints.narrowed,
                allow_result=hints.allow_result,
                free_text=hints.free_text,
            )
        )
        return g.accepts(_call(name, args))

    assert admits("get_weather", {"city": "Madrid"})
    assert not admits("get_weather", {"city": "MADRADAS"})  # a value nobody said
    assert not admits("report_weather", {"city": "Madrid", "condition": "x", "temp_c": 1})
    p.record("get_weather", {"city": "Madrid"}, {"ok": True, "data": {"temp_c": 24}})
    p.end_batch()
    good = {"city": "Madrid", "condition": "sunny", "temp_c": 24}
    assert admits("report_weather", good)
    assert not admits("report_weather", {**good, "temp_c": 25})  # no result held 25
    assert not admits("get_weather", {"city": "Madrid"})  # done: the end is open


def test_the_json_schema_and_tool_choice_say_the_same() -> None:
    p = _weather_policy()
    p.begin_turn([{"role": "user", "content": "Weather in Madrid?"}])
    p.record("get_weather", {"city": "Madrid"}, {"ok": True, "data": {"temp_c": 24}})
    p.end_batch()
    constraint = compile_turn(
        p._workflow,
        p._grounding.narrowed(p._steps.values),
        WEATHER,
        succeeded=("get_weather",),
    )
    check = Draft202012Validator(constraint.json_schema())
    good = {"city": "Madrid", "condition": "sunny", "temp_c": 24}
    assert check.is_valid({"name": "report_weather", "arguments": good})
    assert not check.is_valid({"name": "report_weather", "arguments": {**good, "temp_c": 3}})
    assert not check.is_valid({"name": "get_weather", "arguments": {"city": "Madrid"}})
    assert constraint.tool_choice() == {
        "type": "function",
        "function": {"name": "report_weather"},
    }


def test_native_mode_sends_the_legal_tools_narrowed_and_names_the_one_to_call() -> None:
    p = _weather_policy()
    proceed = p.begin_turn([{"role": "user", "content": "Weather in Madrid?"}])
    hints = proceed.hints  # type: ignore[union-attr]
    specs = [{"name": n, "description": "", "input_schema": s} for n, s in WEATHER.items()]
    base = ChatRequest(
        model="m",
        messages=[],
        extra={"tools": to_openai_tools(specs), "tool_choice": "auto"},
    )
    sent = NativeMode().turn_request(base, [], seen_ids=set(), tools_left=True, hints=hints)
    tools = sent.extra["tools"]
    assert [t["function"]["name"] for t in tools] == ["get_weather"]
    city = tools[0]["function"]["parameters"]["properties"]["city"]
    assert "Madrid" in city["pattern"]
    assert sent.extra["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # Without hints (a plain stream), the plan's tools go as they are.
    plain = NativeMode().turn_request(base, [], seen_ids=set(), tools_left=True)
    assert plain.extra == base.extra


def test_a_budget_keeps_a_done_step_a_choice_until_it_is_spent() -> None:
    schemas = {"report": _obj(supplier={"type": "string"}), "audit": _obj(worst={"type": "string"})}
    wf = parse_workflow(
        {
            "name": "audit",
            "tools": list(schemas),
            "required_steps": ["report"],
            "terminal_tools": ["audit"],
            "max_calls": {"report": 2},
            "provenance": {"report": {"supplier": "user"}},
        },
        known_tools=list(schemas),
    )
    assert list(compile_turn(wf, {}, schemas, succeeded=()).tools) == ["report"]
    after_one = compile_turn(wf, {}, schemas, succeeded=("report",), calls={"report": 1})
    assert list(after_one.tools) == ["report", "audit"]
    spent = compile_turn(wf, {}, schemas, succeeded=("report",), calls={"report": 2})
    assert list(spent.tools) == ["audit"]
    # The policy refuses a call past the budget with a nudge, and spends the words a
    # repeated call used, so the next report is of another supplier.
    p = WorkflowPolicy(wf, schemas=schemas)
    p.begin_turn([{"role": "user", "content": "Audit Northwind and Contoso"}])
    for supplier in ("Northwind", "Contoso"):
        assert isinstance(p.check_call("report", {"supplier": supplier}), Run)
        p.record("report", {"supplier": supplier}, {"ok": True, "data": {"defects": 1}})
        p.end_batch()
        if supplier == "Northwind":
            pattern = p.hints().narrowed["report"]["properties"]["supplier"]["pattern"]
            assert "Contoso" in pattern and "Northwind" not in pattern
    refused = p.check_call("report", {"supplier": "Northwind"})
    assert isinstance(refused, Refuse) and refused.nudge.kind == "budget"
    assert "report" in p.hints().narrowed and p.hints().narrowed["report"] is None


def test_a_bad_budget_is_refused_by_name() -> None:
    base = {"name": "w", "tools": ["report", "audit"], "terminal_tools": ["audit"]}
    for budget, says in (
        ({"nope": 2}, "max_calls names 'nope'"),
        ({"report": 0}, "max_calls.report"),
        ({"report": 101}, "max_calls.report"),
    ):
        with pytest.raises(RequestError, match=says):
            parse_workflow({**base, "max_calls": budget}, known_tools=["report", "audit"])


def test_a_free_side_tool_is_no_detour_once_the_end_can_be_called() -> None:
    # No required step: the answer is legal from the first turn, and a side tool only
    # invention could fill is left out beside it; one whose arguments are held stays.
    schemas = {
        "lookup_stock": _obj(text={"type": "string"}),
        "get_weather": _obj(city={"type": "string"}),
        "answer": _obj(answer={"type": "string"}),
    }
    workflow = parse_workflow(
        {"name": "qa", "tools": list(schemas), "terminal_tools": ["answer"]},
        known_tools=list(schemas),
    )
    assert list(compile_turn(workflow, {}, schemas, succeeded=()).tools) == ["answer"]
    held = {"get_weather": _obj(city={"enum": ["Paris"]})}
    constraint = compile_turn(workflow, held, schemas, succeeded=())
    assert list(constraint.tools) == ["get_weather", "answer"]


def test_a_step_with_min_calls_stays_the_step_until_made_that_often() -> None:
    # "Read each of the three reports, then audit": the end waits for three reports, and
    # each report takes a supplier no earlier report took (the user's names, spent).
    schemas = {"report": _obj(supplier={"type": "string"}), "audit": _obj(worst={"type": "string"})}
    wf = parse_workflow(
        {
            "name": "audit",
            "tools": list(schemas),
            "required_steps": ["report"],
            "terminal_tools": ["audit"],
            "max_calls": {"report": 3},
            "min_calls": {"report": 3},
            "provenance": {"report": {"supplier": "user"}},
        },
        known_tools=list(schemas),
    )
    assert wf.to_dict()["min_calls"] == {"report": 3}
    grammar = FrameGrammar(tools=schemas, result=("R", {"type": "object"}), max_tokens=256)
    p = WorkflowPolicy(wf, schemas=schemas)
    p.begin_turn([{"role": "user", "content": "Audit Northwind, Contoso and Fabrikam."}])

    def admits(name: str, args: dict[str, Any]) -> bool:
        hints = p.hints()
        g = parse(
            grammar.for_turn(
                TurnIds("t1", (), "r1"),
                narrowed=hints.narrowed,
                allow_result=hints.allow_result,
                free_text=hints.free_text,
            )
        )
        return g.accepts(_call(name, args))

    done: list[str] = []
    for supplier in ("Contoso", "Northwind", "Fabrikam"):
        assert not admits("audit", {"worst": "Contoso"})  # the end waits
        assert isinstance(p.check_call("audit", {"worst": "Contoso"}), Refuse)
        for earlier in done:
            assert not admits("report", {"supplier": earlier})  # never the same report twice
        assert admits("report", {"supplier": supplier})
        p.record("report", {"supplier": supplier}, {"ok": True, "data": {"defects": 1}})
        p.end_batch()
        done.append(supplier)
    assert isinstance(p.check_call("audit", {"worst": "Contoso"}), Run)


def test_min_calls_is_checked_by_name() -> None:
    base = {
        "name": "w",
        "tools": ["report", "audit"],
        "required_steps": ["report"],
        "terminal_tools": ["audit"],
    }
    for doc, says in (
        ({"min_calls": {"audit": 2}}, "min_calls names 'audit', which is not in 'required_steps'"),
        ({"min_calls": {"report": 3}, "max_calls": {"report": 2}}, "more than its max_calls"),
        ({"min_calls": {"report": 0}}, "min_calls.report"),
    ):
        with pytest.raises(RequestError, match=says):
            parse_workflow({**base, **doc}, known_tools=["report", "audit"])


def test_two_arguments_of_one_call_take_different_values() -> None:
    # Both codes the user gave fit both arguments: the grammar, the JSON Schema and the
    # validator let the origin take one and the destination the other, never one twice.
    schemas = {
        "search": _obj(
            origin={"type": "string", "description": "IATA code, e.g. CDG"},
            destination={"type": "string", "description": "IATA code, e.g. JFK"},
            date={"type": "string", "format": "date"},
        ),
        "book": _obj(flight={"type": "string"}),
    }
    wf = parse_workflow(
        {
            "name": "fly",
            "tools": list(schemas),
            "required_steps": ["search"],
            "terminal_tools": ["book"],
            "provenance": {"search": {"origin": "user", "destination": "user"}},
        },
        known_tools=list(schemas),
    )
    p = WorkflowPolicy(wf, schemas=schemas)
    p.begin_turn([{"role": "user", "content": "A flight from CDG to JFK on 2026-12-03."}])
    grammar = FrameGrammar(tools=schemas, result=("R", {"type": "object"}), max_tokens=256)
    hints = p.hints()
    g = parse(
        grammar.for_turn(
            TurnIds("t1", (), "r1"),
            narrowed=hints.narrowed,
            allow_result=hints.allow_result,
            free_text=hints.free_text,
        )
    )
    narrowed = hints.narrowed["search"]
    check = Draft202012Validator(narrowed)
    for origin, destination, ok in (
        ("CDG", "JFK", True),
        ("JFK", "CDG", True),
        ("CDG", "CDG", False),
        ("JFK", "JFK", False),
    ):
        args = {"origin": origin, "destination": destination, "date": "2026-12-03"}
        assert g.accepts(_call("search", args)) is ok, args
        assert check.is_valid(args) is ok, args
    # Numbers may repeat (two guests, two nights): only strings are kept apart.
    stay = _obj(guests={"type": "integer"}, nights={"type": "integer"})
    held = Held(said_in("2 guests for 2 nights"))
    out = narrow_properties("stay", stay, {}, held, defaults=True)
    assert out is not None and "anyOf" not in out


def test_an_identifier_is_not_offered_the_users_email() -> None:
    held = Held(said_in("Send the confirmation to ana@example.com."))
    confirm = _obj(booking_ref={"type": "string"}, email={"type": "string"})
    # Before any booking, no identifier is held: the call cannot be made yet.
    assert narrow_properties("confirm", confirm, {}, held, defaults=True) is None
    # Unless the identifier says it takes an address.
    user = _obj(user_id={"type": "string", "description": "the user's e-mail address"})
    out = narrow_properties("lookup", user, {}, held, defaults=True)
    assert out is not None and out["properties"]["user_id"] == {"enum": ["ana@example.com"]}
