"""Open Responses conformance of what the service answers (the API tests' fixture,
the end-to-end compliance cases): every Response object and every response event,
checked with ``jsonschema`` against the JSON Schemas of the ``openresponses-types``
models, which are generated from the Open Responses OpenAPI document (spec
version 2026-04-24).

The models leave extra properties open, so LMSP's own fields (``task``, ``seed``,
an event's ``created_at``) pass. ``response.cancelled``, which the specification
has no schema for, is checked as a response event: ``type``, ``sequence_number``
and a ``response`` that is a ResponseResource.
"""
from __future__ import annotations

import enum
import json
import typing
from functools import cache

import jsonschema
import openresponses_types.types as spec
import pydantic

RESPONSE_EVENT = {"type": "object", "required": ["type", "sequence_number", "response"],
                  "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}}}
OWN_EVENTS = ("response.cancelled",)  # LMSP's, carrying a Response object like the others


def _type_values(model: type[pydantic.BaseModel]) -> list[str]:
    annotation = model.model_fields["type"].annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [member.value for member in annotation]
    return [value for value in typing.get_args(annotation) if isinstance(value, str)]


def _validator(model: type[pydantic.BaseModel]) -> jsonschema.protocols.Validator:
    schema = model.model_json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@cache
def response_validator() -> jsonschema.protocols.Validator:
    return _validator(spec.ResponseResource)


@cache
def event_validators() -> dict[str, jsonschema.protocols.Validator]:
    """The schema of each streaming event of the specification, by its ``type``."""
    out = {}
    for name, model in vars(spec).items():
        if name.endswith("StreamingEvent") and isinstance(model, type) and issubclass(model, pydantic.BaseModel):
            validator = _validator(model)
            for value in _type_values(model):
                out[value] = validator
    assert {"response.created", "response.output_text.delta", "response.completed", "error"} <= set(out)
    return out


def sse_data(text: str) -> list[dict]:
    """The parsed ``data`` of each frame of an SSE body."""
    return [json.loads(line[len("data: "):]) for line in text.split("\n") if line.startswith("data: ")]


class Conformance:
    """Checks bodies and streams; counts what it checked (a test can see it ran)."""

    def __init__(self) -> None:
        self.responses = 0
        self.events = 0

    def check_response(self, body: dict) -> None:
        response_validator().validate(body)
        self.responses += 1

    def check_event(self, event: dict, *, in_log: bool = False) -> None:
        """An event of a response stream; ``in_log``: of the task's log, where the
        ``task.*`` events are LMSP's own."""
        kind = event.get("type")
        if in_log and isinstance(kind, str) and kind.startswith("task."):
            return
        if kind in OWN_EVENTS:
            jsonschema.validate(event, RESPONSE_EVENT)
            self.check_response(event["response"])
        else:
            validator = event_validators().get(kind)
            assert validator is not None, f"an event of a type Open Responses does not know: {kind!r}"
            validator.validate(event)
            if "response" in event:
                self.responses += 1
        self.events += 1

    def check(self, method: str, path: str, result) -> None:
        """Whatever ``method path`` answered, if it is a Response object, a list of them,
        or a stream or page of response events."""
        path = path.split("?")[0]
        if not path.startswith(("/v1/responses", "/v1/tasks/")) or result.status_code >= 400:
            return
        ctype = (result.headers.get("Content-Type") or "").split(";")[0]
        in_log = path.startswith("/v1/tasks/")
        if ctype == "text/event-stream":
            for event in sse_data(result.text):
                self.check_event(event, in_log=in_log)
            return
        if ctype != "application/json" or not result.content:
            return
        self.check_body(json.loads(result.content), in_log=in_log)

    def check_body(self, body: object, *, in_log: bool) -> None:
        if not isinstance(body, dict):
            return
        if body.get("object") == "response" and not body.get("deleted"):
            self.check_response(body)
        elif body.get("object") == "list":
            for entry in body.get("data") or []:
                if isinstance(entry, dict) and entry.get("object") == "response":
                    self.check_response(entry)
                elif isinstance(entry, dict) and "sequence_number" in entry:
                    self.check_event(entry, in_log=in_log)


class CheckedApp:
    """A WSGI app whose every answer goes through ``conformance`` as it is sent: each
    event of a stream when its frame is complete (also in a stream its reader leaves
    early), a JSON body once whole. For the tests that call the app without an Api
    (raw WSGI, the openai package over a WSGI transport)."""

    def __init__(self, app, conformance: Conformance) -> None:
        self.app = app
        self.conformance = conformance

    def __call__(self, environ, start_response):
        seen: dict = {}

        def start(status, headers, exc_info=None):
            seen["status"] = int(status.split()[0])
            seen["type"] = next((v for k, v in headers if k.lower() == "content-type"), "").split(";")[0]
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        body = self.app(environ, start)
        return _CheckedBody(body, environ.get("PATH_INFO", ""), seen, self.conformance)


class _CheckedBody:
    def __init__(self, body, path: str, seen: dict, conformance: Conformance) -> None:
        self.body = body
        self.path = path
        self.seen = seen
        self.conformance = conformance
        self.buffer = b""

    def __iter__(self):
        for chunk in self.body:
            self.take(chunk)
            yield chunk
        self.finish()

    def close(self) -> None:
        close = getattr(self.body, "close", None)
        if close is not None:
            close()

    def wanted(self) -> bool:
        return self.path.startswith(("/v1/responses", "/v1/tasks/")) and self.seen.get("status", 500) < 400

    def take(self, chunk: bytes) -> None:
        if not self.wanted():
            return
        self.buffer += chunk
        if self.seen.get("type") != "text/event-stream":
            return
        *frames, self.buffer = self.buffer.split(b"\n\n")
        for event in sse_data(b"\n\n".join(frames).decode("utf-8")):
            self.conformance.check_event(event, in_log=self.path.startswith("/v1/tasks/"))

    def finish(self) -> None:
        if self.wanted() and self.seen.get("type") == "application/json" and self.buffer:
            self.conformance.check_body(json.loads(self.buffer), in_log=self.path.startswith("/v1/tasks/"))
