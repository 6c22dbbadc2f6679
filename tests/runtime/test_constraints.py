"""The output forms a request asks for, as grammars: what the converter cannot hold
the output to is refused (a 400 naming the field), never run unconstrained."""
from __future__ import annotations

import pytest

from lmsp.errors import InvalidRequest
from lmsp.runtime import constraints

OK = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}},
    {"type": "string", "pattern": "^[a-z]{2,4}$"},
    {"type": "string", "format": "date-time"},
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
    {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "boolean"}}}}, "$ref": "#/$defs/P"},
]
REFUSED = [
    ({"not": {"type": "string"}}, "not supported", "not"),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}}, "integers only",
     "properties.n.minimum"),
    ({"type": "string", "pattern": "[a-z]+"}, "must start with ^", "pattern"),
    ({"type": "string", "pattern": "^a(?=b)$"}, "cannot read the pattern", "pattern"),
    ({"type": "string", "format": "email"}, "'email'", "format"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "uniqueItems"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "does not have",
     "properties.a.$ref"),
    ({"type": "object", "patternProperties": {"^x$": {}}}, "patternProperties", "patternProperties"),
]


def request(schema: dict) -> dict:
    return {"text": {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}}


@pytest.mark.parametrize("schema", OK)
def test_what_the_converter_holds_to_is_a_grammar(schema):
    constraints.check(request(schema))
    assert constraints.grammar(request(schema))["gbnf"]


@pytest.mark.parametrize("schema,why,path", REFUSED)
def test_what_it_would_skip_is_refused_naming_the_keyword(schema, why, path):
    with pytest.raises(InvalidRequest, match=why.replace("(", r"\(").replace("^", r"\^")) as refused:
        constraints.check(request(schema))
    assert refused.value.param == f"text.format.schema.{path}"
    parameters = {"type": "object", "properties": {"a": schema}}
    tools = {"tools": [{"type": "function", "name": "f", "parameters": parameters}], "tool_choice": "required"}
    with pytest.raises(InvalidRequest) as refused:
        constraints.check(tools)
    assert refused.value.param.startswith("tools[0].parameters.properties.a.")


def test_tools_make_a_grammar_of_calls():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}},
             {"type": "function", "name": "g", "parameters": {"type": "object"}}]
    assert constraints.grammar({"tools": tools, "tool_choice": "none"}) is None
    auto = constraints.grammar({"tools": tools})
    assert auto["lazy"] and auto["triggers"] == [constraints.CALL_TRIGGER]
    required = constraints.grammar({"tools": tools, "tool_choice": "required"})
    assert not required.get("lazy") and '"\\"f\\""' in required["gbnf"] and '"\\"g\\""' in required["gbnf"]
    named = constraints.grammar({"tools": tools, "tool_choice": {"type": "function", "name": "g"}})
    assert '"\\"g\\""' in named["gbnf"] and '"\\"f\\""' not in named["gbnf"]


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ROOT = "root ::= "


def test_parallel_calls_are_one_per_line_up_to_the_limit():
    tools = {"tools": [{"type": "function", "name": "root", "parameters": CITY}], "tool_choice": "required",
             "max_output_tokens": 100}
    one = constraints.grammar({**tools, "parallel_tool_calls": False})["gbnf"]
    assert "call-root" not in one
    assert constraints.grammar(tools)["gbnf"].startswith(ROOT + 'call-root ("\\n" call-root)*\n')
    three = constraints.grammar({**tools, "max_tool_calls": 3})["gbnf"]
    assert three.startswith(ROOT + 'call-root ("\\n" call-root){0,2}\n')
    assert '"\\"root\\""' in three  # a literal that reads like a rule's name is left as it is
    # a limit the output's tokens could not reach is no limit
    assert "*" in constraints.grammar({**tools, "max_tool_calls": 100})["gbnf"].splitlines()[0]
    answer = constraints.grammar({**tools, "tool_choice": "auto", "text": {"format": {"type": "json_object"}}})
    assert answer["gbnf"].startswith(ROOT + 'call-root ("\\n" call-root)* | answer-root\n')
    assert "answer-space ::=" in answer["gbnf"] and "call-space ::=" in answer["gbnf"]


def test_prefixed_names_every_rule_and_reference_and_nothing_else():
    gbnf = 'root ::= item ("," item)*\nitem ::= "item" [a-z\\]item] space\nspace ::= " "?'
    assert constraints.prefixed(gbnf, "x-") == (
        'x-root ::= x-item ("," x-item)*\nx-item ::= "item" [a-z\\]item] x-space\nx-space ::= " "?')


def test_tool_parameters_that_refer_into_themselves_make_a_grammar():
    point = {"type": "object", "properties": {"at": {"$ref": "#/$defs/xy"}}, "required": ["at"],
             "$defs": {"xy": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}}
    tools = {"tools": [{"type": "function", "name": "f", "parameters": point},
                       {"type": "function", "name": "g", "parameters": point}], "tool_choice": "required"}
    for request in (tools, {**tools, "parallel_tool_calls": False},
                    {**tools, "tool_choice": "auto", "parallel_tool_calls": False,
                     "text": {"format": {"type": "json_schema", "name": "n", "schema": point}}}):
        constraints.check(request)
        assert "root ::=" in constraints.grammar(request)["gbnf"]
