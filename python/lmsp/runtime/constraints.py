"""What a request asks of the output's form, as the engine's grammar.

``text.format`` ``json_schema`` is held to the grammar llama.cpp's JSON-schema
converter makes of its schema, ``json_object`` to that of ``{"type":
"object"}``; ``text`` (the default) to nothing. Function tools (with
``tool_choice`` other than ``none``) are held to the service's own call
format (:mod:`lmsp.calls`): the grammar of ``{"name", "arguments"}`` objects,
one alternative per tool with its parameters' schema, as many one after the
other as the request allows (:func:`lmsp.calls.most_calls`); with
``required`` or a named tool the grammar holds from the first token, with
``auto`` it is lazy, triggered by an output that opens with ``{``; with
``auto`` and a JSON ``text.format`` the output is calls or the answer in that
form. A schema the
converter cannot
express is refused when the task is created (:func:`check`), never run
unconstrained.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .. import calls
from ..errors import InvalidRequest

SCHEMA_PARAM = "text.format.schema"
ANY_OBJECT = {"type": "object"}
# an output that opens with "{" (after space) is a call; the grammar is fed from the brace
CALL_TRIGGER = {"type": "pattern", "value": r"^\s*(\{)"}


@lru_cache(maxsize=256)
def _schema_grammar(schema_json: str) -> str:
    from .. import native  # the extension loads in the workers only

    return native.schema_grammar(schema_json)


def schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of a schema (its properties' order kept: it is the output's)."""
    return _schema_grammar(json.dumps(schema))


# keywords the converter would skip, so that an output could break them: refused
UNENFORCED = (
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "contains", "minContains", "maxContains",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "multipleOf", "prefixItems", "$anchor", "$dynamicRef",
)  # fmt: skip
FORMATS = ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def unenforced(schema: Any, path: str = "") -> str | None:
    """The first part of a schema the grammar converter would not hold the output to
    (it skips what it does not know): ``"<where>: <what>"``, or None."""
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            found = unenforced(sub, f"{path}[{i}]")
            if found:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    found = _unenforced_here(schema, path or "the schema")
    if found:
        return found
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                found = unenforced(sub, f"{path}.{key}.{name}" if path else f"{key}.{name}")
                if found:
                    return found
    for key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties"):
        found = unenforced(schema.get(key), f"{path}.{key}" if path else key)
        if found:
            return found
    return None


def _unenforced_here(schema: dict[str, Any], where: str) -> str | None:
    """:func:`unenforced` of one schema object's own keywords."""
    for key in UNENFORCED:
        if key in schema:
            return f"{where}: '{key}' is not supported"
    if schema.get("uniqueItems"):
        return f"{where}: 'uniqueItems' is not supported"
    fmt = schema.get("format")
    if fmt is not None and fmt not in FORMATS:
        return f"{where}: format {fmt!r} is not supported (only {', '.join(FORMATS[:4])})"
    if any(k in schema for k in BOUNDS) and schema.get("type") != "integer":
        return f"{where}: minimum and maximum are supported for integers only"
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not _pattern_supported(pattern):
        return f"{where}: pattern {pattern!r} is not supported (it must start with ^ and end with $)"
    return None


# a pattern the converter cannot read (a lookahead): it takes any string then, and only warns
UNREADABLE_PATTERN = "^(?=)$"


def _pattern_supported(pattern: str) -> bool:
    """Whether the converter makes a grammar of the pattern: for one it cannot read it
    makes the grammar of any string, the same for every such pattern."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        return False
    try:
        unread = schema_grammar({"type": "string", "pattern": UNREADABLE_PATTERN})
        return schema_grammar({"type": "string", "pattern": pattern}) != unread
    except ValueError:
        return False


def output_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the output is held to (None: free text)."""
    fmt = (request.get("text") or {}).get("format") or {}
    kind = fmt.get("type")
    if kind == "json_schema":
        schema: dict[str, Any] = fmt.get("schema") or ANY_OBJECT
        return schema
    if kind == "json_object":
        return ANY_OBJECT
    return None


def tool_mode(request: dict[str, Any]) -> str | None:
    """``required``, ``auto`` or None: :func:`lmsp.calls.mode`."""
    return calls.mode(request)


def callable_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools the model may call: all of them, or the one ``tool_choice`` names."""
    tools: list[dict[str, Any]] = request.get("tools") or []
    choice = request.get("tool_choice")
    if isinstance(choice, dict):
        return [t for t in tools if t["name"] == choice.get("name")]
    return tools


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The schema of one call of any of ``tools``: the name first, then the arguments."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": t.get("parameters") or ANY_OBJECT},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


# a token of a grammar's text: a literal, a character class, a name, or any other character
GBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9_-]+|.', re.S)
RULE = re.compile(r"^([A-Za-z0-9_-]+) ::=", re.M)


def prefixed(gbnf: str, prefix: str) -> str:
    """A grammar with each of its rules named ``prefix`` + its name (so that two
    grammars go in one without a clash)."""
    names = set(RULE.findall(gbnf))
    return GBNF_TOKEN.sub(lambda m: prefix + m.group(0) if m.group(0) in names else m.group(0), gbnf)


def calls_grammar(request: dict[str, Any], answer: dict[str, Any] | None = None) -> str:
    """The grammar of the output's calls, one per line up to the request's
    limit (any number: :func:`lmsp.calls.most_calls` None, or more than the output's
    tokens could hold), or the answer of schema ``answer``."""
    one = call_schema(callable_tools(request))
    most = calls.most_calls(request)
    if most == 1 and answer is None:
        return schema_grammar(one)
    if most == 1:
        return schema_grammar({"anyOf": [*one["anyOf"], answer]})
    more = "*" if most is None or most >= int(request.get("max_output_tokens") or 0) else f"{{0,{most - 1}}}"
    rules = [f'root ::= call-root ("\\n" call-root){more}' + (" | answer-root" if answer is not None else "")]
    rules.append(prefixed(schema_grammar(one), "call-"))
    if answer is not None:
        rules.append(prefixed(schema_grammar(answer), "answer-"))
    return "\n".join(rules)


def grammar(request: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's ``grammar`` argument for a request (None: unconstrained);
    ValueError for a schema the converter cannot express."""
    mode = tool_mode(request)
    schema = output_schema(request)
    if mode is not None:
        if mode == "auto" and schema is not None:  # calls, or the answer in its form
            return {"gbnf": calls_grammar(request, schema)}
        gbnf = calls_grammar(request)
        if mode == "auto":
            return {"gbnf": gbnf, "lazy": True, "triggers": [CALL_TRIGGER]}
        return {"gbnf": gbnf}
    if schema is None:
        return None
    return {"gbnf": schema_grammar(schema)}


def check(request: dict[str, Any]) -> None:
    """A request whose output form cannot be held to: InvalidRequest (400)."""
    if tool_mode(request) is not None:
        for i, tool in enumerate(request.get("tools") or ()):
            param = f"tools[{i}].parameters"
            _check_schema(tool.get("parameters") or ANY_OBJECT, param)
    schema = output_schema(request)
    if schema is not None:
        _check_schema(schema, SCHEMA_PARAM)
    try:
        grammar(request)
    except ValueError as exc:
        param = "tools" if tool_mode(request) is not None else SCHEMA_PARAM
        raise InvalidRequest(f"'{param}' is not supported: {exc}", param=param) from None


def _check_schema(schema: dict[str, Any], param: str) -> None:
    why = unenforced(schema)
    if why is None:
        try:
            schema_grammar(schema)
            return
        except ValueError as exc:
            why = str(exc)
    raise InvalidRequest(f"'{param}' is not supported: {why}", param=param)
