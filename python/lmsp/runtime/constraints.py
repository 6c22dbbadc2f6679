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
form. A schema the converter cannot express, or that no output could satisfy
(:mod:`.schema_check`), is refused when the task is created (:func:`check`),
never run unconstrained; its conversion runs off the gevent hub, bounded in
time, and the grammar it makes is bounded in size.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .. import calls
from ..errors import InvalidRequest
from lmsp.serving.hubsafe import offload_bounded
from . import schema_check

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


# a pattern the converter cannot read (a lookahead): it takes any string then, and only warns
UNREADABLE_PATTERN = "^(?=)$"
# the largest grammar text a request's output form may make
MAX_GRAMMAR_BYTES = 256 * 1024
# the longest the conversion of a request's schemas may take (it runs off the hub)
GRAMMAR_SECONDS = 5.0


def _pattern_supported(pattern: str) -> bool:
    """Whether the converter makes a grammar of the pattern: for one it cannot read it
    makes the grammar of any string, the same for every such pattern."""
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
    """The schema of one call of any of ``tools``: the name first, then the arguments
    (parameters that refer into themselves go under ``$defs``, their references with them)."""
    defs: dict[str, Any] = {}
    alternatives = []
    for i, tool in enumerate(tools):
        arguments = tool.get("parameters") or ANY_OBJECT
        if refers(arguments):
            defs[f"tool{i}"] = moved(arguments, f"#/$defs/tool{i}")
            arguments = {"$ref": f"#/$defs/tool{i}"}
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool["name"]}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": alternatives, **({"$defs": defs} if defs else {})}


def refers(schema: dict[str, Any]) -> bool:
    """Whether a schema holds a ``$ref`` (into itself: it must stay its document's root)."""
    return '"$ref"' in json.dumps(schema)


def moved(schema: Any, base: str) -> Any:
    """``schema`` with its references into itself (``#/...``) made to point under ``base``."""
    if isinstance(schema, dict):
        return {
            k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#/") else moved(v, base)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [moved(v, base) for v in schema]
    return schema


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
    if most == 1:
        if answer is None:
            return schema_grammar(one)
        if refers(answer):
            one.setdefault("$defs", {})["answer"] = moved(answer, "#/$defs/answer")
            answer = {"$ref": "#/$defs/answer"}
        return schema_grammar({**one, "anyOf": [*one["anyOf"], answer]})
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


def constrained(request: dict[str, Any]) -> bool:
    """Whether the request's output is held to a grammar."""
    return tool_mode(request) is not None or output_schema(request) is not None


def schemas(request: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The schemas a request's grammar is made of, each with its param."""
    found = []
    if tool_mode(request) is not None:
        for i, tool in enumerate(request.get("tools") or ()):
            found.append((tool.get("parameters") or ANY_OBJECT, f"tools[{i}].parameters"))
    schema = output_schema(request)
    if schema is not None:
        found.append((schema, SCHEMA_PARAM))
    return found


def check(request: dict[str, Any]) -> None:
    """A request whose output form cannot be held to, or that no output could
    satisfy: InvalidRequest (400) naming the schema's keyword. The schemas are
    checked here (:mod:`.schema_check`); their conversion to a grammar runs off
    the gevent hub, for at most :data:`GRAMMAR_SECONDS`."""
    checked = [(schema, param, schema_check.check(schema, param)) for schema, param in schemas(request)]
    if not checked:
        return
    try:
        offload_bounded(GRAMMAR_SECONDS, _convert, request, checked)
    except TimeoutError:
        param = checked[-1][1]
        raise InvalidRequest(
            f"'{param}' takes longer than {GRAMMAR_SECONDS:g} s to make into a grammar", param=param
        ) from None


def _convert(request: dict[str, Any], checked: list[tuple[dict[str, Any], str, schema_check.Report]]) -> None:
    """:func:`check`'s conversion: each pattern, each schema, then the request's grammar,
    each made and held to what the engine's grammar sampler takes."""
    for schema, param, report in checked:
        for path, pattern in report.patterns:
            at = schema_check.where(param, path)
            if not _pattern_supported(pattern):
                raise InvalidRequest(f"'{at}' is not supported: the grammar cannot read the pattern", param=at)
            _held(schema_grammar({"type": "string", "pattern": pattern}), at)
        try:
            _held(schema_grammar(schema), param)
        except ValueError as exc:
            at = schema_check.where(param, _pointer(str(exc)))
            raise InvalidRequest(f"'{at}' is not supported: {exc}", param=at) from None
    param = "tools" if tool_mode(request) is not None else SCHEMA_PARAM
    try:
        made = grammar(request)
    except ValueError as exc:
        raise InvalidRequest(f"'{param}' is not supported: {exc}", param=param) from None
    gbnf = (made or {}).get("gbnf") or ""
    if len(gbnf) > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(
            f"'{param}' makes a grammar of {len(gbnf)} bytes, more than the {MAX_GRAMMAR_BYTES} it may have",
            param=param,
        )
    _held(gbnf, param)


def _held(gbnf: str, param: str) -> None:
    """Refuse (naming ``param``) a grammar the engine's sampler would not take."""
    from .. import native  # the extension loads in the workers only

    bad = bad_repetition(gbnf)
    if bad:
        raise InvalidRequest(f"'{param}' {bad}", param=param)
    try:
        native.check_grammar(gbnf)
    except ValueError as exc:
        raise InvalidRequest(f"'{param}' is not supported: {exc}", param=param) from None


# a repetition in a grammar's text, {m}, {m,} or {m,n}, outside its literals and character classes
REPEAT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")


def bad_repetition(gbnf: str) -> str | None:
    """Why a grammar's repetition cannot be held (fewer at most than at least, more
    than :data:`~.schema_check.MAX_COUNT`), or None."""
    text = "".join(" " if token[0] in '"[' else token for token in GBNF_TOKEN.findall(gbnf))
    for m in REPEAT.finditer(text):
        low = int(m.group(1))
        high = low if m.group(2) is None else int(m.group(3)) if m.group(3) else None
        if high is not None and high < low:
            return f"makes the grammar repeat {m.group(0)}: fewer at most than at least, no output could satisfy it"
        if max(low, high or 0) > schema_check.MAX_COUNT:
            return f"makes the grammar repeat {m.group(0)}: more than it can hold (at most {schema_check.MAX_COUNT})"
    return None


# where the converter's error says it is: "JSON schema error at #/properties/a: ..."
POINTER = re.compile(r"error at #((?:/[^/:\s]*)*)")
INDEXED = ("anyOf", "oneOf", "allOf", "items", "prefixItems", "type", "enum")


def _pointer(message: str) -> schema_check.Path:
    """The schema path of the converter's error (the schema's own: empty when it names none)."""
    found = POINTER.search(message)
    if found is None:
        return ()
    path: list[str | int] = []
    for part in found.group(1).split("/")[1:]:
        path.append(int(part) if part.isdigit() and path and path[-1] in INDEXED else part)
    return tuple(path)
