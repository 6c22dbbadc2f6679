"""A schema no output could satisfy, or whose grammar the service could not hold,
is refused naming the exact keyword; a schema with instances passes."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from lmsp.errors import InvalidRequest
from lmsp.runtime import constraints, schema_check

P = "text.format.schema"


def obj(**props) -> dict:
    return {"type": "object", "properties": props}


CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
ENDLESS = {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
                              "required": ["next"]}},
           "$ref": "#/$defs/node"}
ENDLESS_ITEMS = {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}},
                 "$ref": "#/$defs/t"}
CONTRADICTIONS = [
    (obj(a={"type": "string", "minLength": 5, "maxLength": 2}), "properties.a.maxLength"),
    (obj(a={"type": "array", "minItems": 3, "maxItems": 1}), "properties.a.maxItems"),
    (obj(a={"type": "object", "minProperties": 3, "maxProperties": 1}), "properties.a.maxProperties"),
    (obj(a={"type": "integer", "minimum": 5, "maximum": 2}), "properties.a.maximum"),
    (obj(a={"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3}), "properties.a.exclusiveMaximum"),
    (obj(a={"type": "integer", "minimum": 2.5, "maximum": 2.7}), "properties.a.maximum"),
    (obj(a={"type": "integer", "exclusiveMinimum": 4, "maximum": 4}), "properties.a.maximum"),
    (obj(a={"enum": []}), "properties.a.enum"),
    (obj(a={"type": "string", "enum": ["x", 3]}), "properties.a.enum[1]"),
    (obj(a={"type": "integer", "const": "x"}), "properties.a.const"),
    (obj(a={"type": "string", "maxLength": 2, "const": "long"}), "properties.a.const"),
    (obj(a={"type": "integer", "maximum": 3, "enum": [1, 7]}), "properties.a.enum[1]"),
    ({**obj(a={"type": "string"}), "required": ["a", "b"], "additionalProperties": False}, "required[1]"),
    ({"type": "object", "required": ["a"]}, "required[0]"),
    ({"anyOf": [{"type": "null"}, {"type": "string", "minLength": 9, "maxLength": 1}]}, "anyOf[1].maxLength"),
    ({"type": ["null", "string"], "minLength": 3, "maxLength": 1}, "maxLength"),
    (CYCLE, "$defs.a.$ref"),
    (ENDLESS, "$defs.node.properties.next.$ref"),
    (ENDLESS_ITEMS, "$defs.t.items.$ref"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
     "$defs.a.anyOf[0].$ref"),
    ({"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/b"}]}, "b": {"oneOf": [{"$ref": "#/$defs/a"}]}},
      "type": "array", "items": {"$ref": "#/$defs/a"}}, "$defs.b.oneOf[0].$ref"),
    ({"type": "array", "items": {"$ref": "#/$defs/gone"}}, "items.$ref"),
]
TOO_BIG = [
    ({"type": "array", "minItems": 100000}, "minItems"),
    (obj(a={"type": "string", "maxLength": 5000}), "properties.a.maxLength"),
    (obj(a={"type": "integer", "minimum": -10**20}), "properties.a.minimum"),
    (obj(**{f"p{i}": {"type": "string", "maxLength": 1000} for i in range(30)}), "properties.p20.maxLength"),
]
UNENFORCED = [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 3}},
      "$defs": {"s": {"type": "string"}}}, "properties.a.maxLength"),
    ({"anyOf": [{"type": "string"}], "minLength": 3}, "minLength"),
    (obj(a={"type": "integer", "minimum": 1, "exclusiveMinimum": 3}), "properties.a.exclusiveMinimum"),
    (obj(a={"type": "string", "format": "date", "maxLength": 4}), "properties.a.maxLength"),
    ({"type": "string", "allOf": [{"minLength": 2}]}, "allOf"),
    ({"type": "object", "allOf": [{"type": "string"}]}, "allOf[0]"),
    (obj(a={"type": "integer", "minimum": True}), "properties.a.minimum"),
    (obj(a={"type": "string", "minLength": -1}), "properties.a.minLength"),
    (obj(a={"type": "strin"}), "properties.a.type"),
    (obj(a=[1]), "properties.a"),
]
SATISFIABLE = [
    obj(a={"type": "string", "minLength": 2, "maxLength": 2}),
    obj(a={"type": "integer", "minimum": 3, "maximum": 3}),
    obj(a={"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 4}),
    obj(a={"type": "integer", "minimum": 2.5, "maximum": 3.5}),
    obj(a={"type": "array", "minItems": 2, "maxItems": 2, "items": {"enum": [1, 2]}}),
    obj(a={"type": ["integer", "string"], "const": 5}),
    obj(a={"type": "string", "enum": ["x", "y"], "maxLength": 1}),
    {**obj(a={"type": "string"}), "required": ["a"], "additionalProperties": False},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
     "$ref": "#/$defs/node"},
    {"$defs": {"t": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}]}},
     "$ref": "#/$defs/t"},
    {"type": "object", "allOf": [obj(a={"type": "integer"}), obj(b={"type": "string"})]},
    obj(a={"type": "string", "maxLength": 1000}),
]


@pytest.mark.parametrize("schema,path", CONTRADICTIONS + TOO_BIG + UNENFORCED)
def test_a_schema_no_output_could_satisfy_is_refused_naming_the_keyword(schema, path):
    with pytest.raises(InvalidRequest) as refused:
        schema_check.check(schema, P)
    assert refused.value.param == f"{P}.{path}"
    assert refused.value.status == 400 and f"'{P}.{path}'" in refused.value.message


@pytest.mark.parametrize("schema", SATISFIABLE)
def test_a_schema_with_instances_passes_and_makes_a_grammar(schema):
    schema_check.check(schema, P)
    constraints.check({"text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}})


def test_each_schema_of_a_request_is_named_by_its_own_param():
    bad = obj(a={"type": "string", "minLength": 5, "maxLength": 2})
    tools = [{"type": "function", "name": "f", "parameters": obj()},
             {"type": "function", "name": "g", "parameters": bad}]
    with pytest.raises(InvalidRequest) as refused:
        constraints.check({"tools": tools, "tool_choice": "required"})
    assert refused.value.param == "tools[1].parameters.properties.a.maxLength"
    constraints.check({"tools": tools, "tool_choice": "none"})  # no grammar: nothing held to it


@pytest.mark.parametrize("pattern,why", [("^a{5,2}$", "fewer at most"), ("^(ab){3,1}$", "fewer at most"),
                                         ("^a{5000}$", "more than it can hold")])
def test_a_pattern_whose_grammar_cannot_be_held_is_refused_at_the_pattern(pattern, why):
    with pytest.raises(InvalidRequest, match=why) as refused:
        constraints.check({"text": {"format": {"type": "json_schema", "name": "n",
                                               "schema": obj(a={"type": "string", "pattern": pattern})}}})
    assert refused.value.param == f"{P}.properties.a.pattern"


def test_a_grammar_over_the_size_limit_is_refused(monkeypatch):
    schema = obj(**{f"p{i}": {"type": "string"} for i in range(40)})
    monkeypatch.setattr(constraints, "MAX_GRAMMAR_BYTES", 1000)
    with pytest.raises(InvalidRequest, match="more than the 1000") as refused:
        constraints.check({"text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}})
    assert refused.value.param == P


def test_a_conversion_past_its_time_bound_is_refused_while_it_runs_on(monkeypatch):
    release, finished = threading.Event(), []

    def slow(schema_json: str) -> str:
        release.wait(30)
        finished.append(schema_json)
        return ""

    monkeypatch.setattr(constraints, "GRAMMAR_SECONDS", 0.2)
    monkeypatch.setattr(constraints, "_schema_grammar", slow)
    try:
        with pytest.raises(InvalidRequest, match="longer than 0.2 s") as refused:
            constraints.check({"text": {"format": {"type": "json_schema", "name": "n", "schema": obj()}}})
        assert refused.value.param == P
        assert not finished  # the request was answered without waiting for the conversion
    finally:
        release.set()


GEVENT_CHILD = """
from gevent import monkey
monkey.patch_all()
import json
import gevent
from gevent.monkey import get_original
from lmsp.runtime import constraints

real_sleep = get_original("time", "sleep")
ticks = []

def slow(schema_json):  # a conversion that holds its thread (not the GIL) for 0.5 s
    real_sleep(0.5)
    return 'root ::= "{}"'

constraints._schema_grammar = slow

def ticker():
    while True:
        ticks.append(1)
        gevent.sleep(0.01)

t = gevent.spawn(ticker)
gevent.sleep(0)
constraints.check({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}})
t.kill()
print(json.dumps({"ticks": len(ticks)}))
"""


def test_under_gevent_the_conversion_runs_off_the_hub():
    """Other greenlets (the worker's health check, its other requests) run while a
    request's schema is made into a grammar."""
    out = subprocess.run([sys.executable, "-c", GEVENT_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["ticks"] >= 10  # about 50 in 0.5 s; none on the hub
