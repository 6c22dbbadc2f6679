"""The OpenAPI schemas of Chat Completions' function tools and structured output
(``tools``, ``tool_choice``, ``response_format``, the messages that carry calls);
:mod:`.openapi_openai` puts them in its request schemas.
"""

from __future__ import annotations

from .openapi_schemas import JSON, MAX_TEXT, NAME, NO_NUL, STR, nullable, obj, text

FUNCTION = obj(
    {
        "name": NAME,
        "description": nullable(STR),
        "parameters": nullable({"type": "object", "description": "The schema of the call's arguments (an object)."}),
        "strict": nullable({"type": "boolean"}),
    },
    ["name"],
    extra=False,
)
TOOLS = nullable(
    {"type": "array", "maxItems": 128, "items": obj({"type": {"const": "function"}, "function": FUNCTION}, extra=False)}
)
TOOL_CHOICE = nullable(
    {
        "anyOf": [
            {"enum": ["auto", "none", "required"], "description": "required: `tools` must not be empty."},
            obj(
                {"type": {"const": "function"}, "function": obj({"name": NAME}, ["name"], extra=False)},
                ["type", "function"],
                extra=False,
            ),
        ]
    }
)
RESPONSE_FORMAT = nullable(
    {
        "anyOf": [
            obj({"type": {"enum": ["text", "json_object"]}}, ["type"], extra=False),
            obj(
                {
                    "type": {"const": "json_schema"},
                    "json_schema": obj(
                        {
                            "name": NAME,
                            "schema": {"type": "object"},
                            "description": nullable(STR),
                            "strict": nullable({"type": "boolean"}),
                        },
                        ["name", "schema"],
                        extra=False,
                    ),
                },
                ["type", "json_schema"],
                extra=False,
            ),
        ],
        "description": "A schema the grammar cannot hold the output to: 400 "
        "(`response_format.json_schema.schema`). With `logprobs`, each token's are over the tokens "
        "the grammar allows.",
    }
)
TOOL_CALL = obj(
    {
        "id": text(1, 64),
        "type": {"const": "function"},
        "function": obj({"name": NAME, "arguments": STR}, ["name", "arguments"], extra=False),
    },
    ["id", "function"],
    extra=False,
)
TOOL_CALLS = nullable({"type": "array", "items": TOOL_CALL})
TOOL_MESSAGE_FIELDS: JSON = {
    "tool_call_id": {**text(1, 64), "description": "The id of a tool call of an assistant message before it."},
}
TEXT_PART = obj({"type": {"const": "text"}, "text": text(0, MAX_TEXT, NO_NUL)}, extra=False)
NOT_NULL = {"not": {"type": "null"}}
CHAT_MESSAGE = obj(
    {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": nullable({"anyOf": [text(0, MAX_TEXT, NO_NUL), {"type": "array", "items": TEXT_PART}]}),
        "refusal": {"type": "null"},
        "tool_calls": TOOL_CALLS,
        "function_call": {"type": "null"},
        "audio": {"type": "null"},
        "annotations": {"type": "array", "maxItems": 0},
        "reasoning_content": nullable(text(0, MAX_TEXT, NO_NUL))
        | {"description": "An assistant's earlier reasoning, for a template that shows it again."},
        **TOOL_MESSAGE_FIELDS,
    },
    ["role"],
    extra=False,
) | {
    "allOf": [
        # content, unless an assistant message has tool calls
        {
            "if": {"properties": {"role": {"const": "assistant"}}},
            "then": {
                "anyOf": [
                    {"required": ["content"], "properties": {"content": NOT_NULL}},
                    {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}},
                ]
            },
            "else": {"required": ["content"], "properties": {"content": NOT_NULL}},
        },
        # a tool message answers a call; the other roles have only role and content
        {
            "if": {"properties": {"role": {"const": "tool"}}},
            "then": {"required": ["tool_call_id"], "propertyNames": {"enum": ["role", "content", "tool_call_id"]}},
        },
        {
            "if": {"properties": {"role": {"enum": ["system", "developer", "user"]}}},
            "then": {"propertyNames": {"enum": ["role", "content"]}},
        },
    ]
}
