"""Structured output and function tools of a create request (LMSP B.11): the
``text`` field's format, checked and made into what the task keeps.

``text.format`` is ``{"type": "text"}`` (the default), ``{"type":
"json_object"}`` or ``{"type": "json_schema", "name", "schema",
"description", "strict"}``. Whether a schema can be held to by a grammar is
the runtime's to say, when the task is created (a 400 with ``param:
"text.format.schema"``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lmsp.errors import InvalidRequest

from .common import reject_unknown

FORMAT_TYPES = ("text", "json_object", "json_schema")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SCHEMA_BYTES = 32 * 1024  # a schema's JSON text
TEXT_FORMAT = {"type": "text"}


def parse_text(value: Any) -> dict[str, Any]:
    """``text``: ``{"format": ...}`` as the task keeps it and the Response echoes it."""
    if value is None:
        return {"format": dict(TEXT_FORMAT)}
    if not isinstance(value, dict):
        raise InvalidRequest("'text' must be an object", param="text")
    reject_unknown(value, ("format", "verbosity"), where="text.")
    out: dict[str, Any] = {"format": parse_format(value.get("format"))}
    verbosity = value.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            raise InvalidRequest("'text.verbosity' must be low, medium or high", param="text.verbosity")
        out["verbosity"] = verbosity
    return out


def parse_format(fmt: Any) -> dict[str, Any]:
    if fmt is None:
        return dict(TEXT_FORMAT)
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        raise InvalidRequest(f"'text.format.type' must be one of {', '.join(FORMAT_TYPES)}", param="text.format.type")
    if kind != "json_schema":
        reject_unknown(fmt, ("type",), where="text.format.")
        return {"type": kind}
    reject_unknown(fmt, ("type", "name", "schema", "description", "strict"), where="text.format.")
    name = fmt.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(
            "'text.format.name' is required: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'", param="text.format.name"
        )
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest("'text.format.description' must be a string", param="text.format.description")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("'text.format.strict' must be a boolean", param="text.format.strict")
    schema = check_schema(fmt.get("schema"), "text.format.schema")
    return {"type": "json_schema", "name": name, "description": description, "schema": schema, "strict": bool(strict)}


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """A JSON Schema object of reasonable size (what it admits is the grammar's to say)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param)
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"'{param}' is larger than {MAX_SCHEMA_BYTES} bytes", param=param)
    return schema
