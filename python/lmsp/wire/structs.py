"""The wire types' ground: a request body or an answer is a :class:`msgspec.Struct`
declared once, from which come the check of its fields (:func:`read`, each
refusal naming the field as the client wrote it), and its schema in the OpenAPI
document (:func:`components`).

- :class:`Body`: a request body (or an object inside one). Unknown fields are
  refused.
- :class:`Answer`: an object the service answers with. Its schema lets clients
  read fields added later.
- A Struct's ``__schema__`` (a ClassVar) adds to its schema what a field's type
  cannot say: a rule over two fields, or a union msgspec cannot hold (two kinds
  of array), whose check is then in the code that reads the Struct.

A body comes from :func:`lmsp.api.common.read_json`, which reads numbers as JSON
means them: an integral float (``5.0``) is the integer; ``NaN``, ``Infinity``
and a number beyond a double are not JSON.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Annotated, ClassVar, Iterable, TypeVar

import msgspec
from msgspec import Meta

from lmsp.errors import InvalidRequest

T = TypeVar("T")
JSON = dict[str, Any]

REF = "#/components/schemas/{name}"
NO_NUL = "^[^\\u0000]*$"  # no chat template, tokenizer or file name takes NUL
NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"  # names shown on a terminal (Unicode Cc)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# Field types that several wire types share. A field's own limits are written
# where it is declared, as Annotated[str, Meta(...)].

#: a tool's or a format's name
Name = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
#: the model a request names
ModelName = Annotated[str, Meta(min_length=1, max_length=256)]
#: Unix seconds
Time = Annotated[int, Meta(description="Unix seconds")]

SEED_MAX = 2**32 - 2  # 2**32 - 1 is llama.cpp's "pick one at random"
MAX_STOP = 16
MAX_METADATA = 16
Seed = Annotated[int, Meta(ge=0, le=SEED_MAX)]
StopText = Annotated[str, Meta(min_length=1, max_length=1000)]
#: ``stop``: a sequence, or at most 16, that end the output
Stop = StopText | Annotated[list[StopText], Meta(max_length=MAX_STOP)]
#: ``metadata``: at most 16 string pairs (LMSP B.5)
Metadata = Annotated[
    dict[Annotated[str, Meta(min_length=1, max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=MAX_METADATA),
]


class Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A request body, or an object inside one: unknown fields are refused."""

    __schema__: ClassVar[JSON] = {}


class Empty(Body):
    """A POST that takes no fields: no body, or `{}`."""


class Answer(msgspec.Struct, kw_only=True):
    """An object of an answer."""

    __schema__: ClassVar[JSON] = {}


#: what a refused pattern means, for the client's error message
PATTERN_WORDS: dict[str, str] = {
    NO_NUL: "must not contain NUL characters",
    NO_CONTROL: "must not contain control characters",
}
_REGEX = re.compile(r"^Expected `str` matching regex '(?P<regex>.*)'$", re.DOTALL)


def say(pattern: str, words: str) -> str:
    """``pattern``, whose refusal reads ``'field' <words>``."""
    PATTERN_WORDS[pattern] = words
    return pattern


# msgspec's words for a refusal: "<what> - at `$.a[0].b`"
_AT = re.compile(r"^(?P<what>.*?)(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD = re.compile(r"^Object (?P<how>missing required|contains unknown) field `(?P<name>[^`]*)`$")


def refusal(error: msgspec.ValidationError, where: str = "", value: Any = None, kind: Any = None) -> InvalidRequest:
    """msgspec's refusal as the 400 the client gets, naming the field (``where``: the
    param of the object read, when it is inside a request; ``value`` and ``kind``:
    what was read as what, to name the key of a map's refused entry)."""
    m = _AT.match(str(error))
    assert m is not None  # the pattern matches any text
    path = m["path"] or ""
    if "[...]" in path or "`key` in" in str(error):
        path = _map_entry(path, value, kind)
    what, param = m["what"], (where + path).lstrip(".")
    field = _FIELD.match(what)
    if field is not None:
        param = f"{param}.{field['name']}" if param else field["name"]
        if field["how"] == "missing required":
            return InvalidRequest(f"{param!r} is required", param=param)
        return InvalidRequest(f"unknown field {param!r}", param=param)
    regex = _REGEX.match(what)
    words = PATTERN_WORDS.get(regex["regex"].replace("\\\\", "\\")) if regex else None
    if words is not None:
        return InvalidRequest(f"{param!r} {words}", param=param or None)
    what = what[0].lower() + what[1:]
    if not param:
        return InvalidRequest(f"the body: {what}", param=None)
    return InvalidRequest(f"{param!r}: {what}", param=param)


_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")


def _map_entry(path: str, value: Any, kind: Any) -> str:
    """``path`` with the key of the map entry refused where msgspec writes ``[...]``
    (or nothing, for a refused key): the first entry that ``kind`` refuses alone."""
    out = ""
    for step in _STEP.finditer(path):
        name, index = step[1], step[2]
        if name is not None:
            kind, value, out = _field_type(kind, name), _get(value, name), f"{out}.{name}"
        elif index is not None:
            kind, value, out = _item_type(kind), _get(value, int(index)), f"{out}[{index}]"
        else:
            break
    if not isinstance(value, dict):
        return out
    for key, entry in value.items():
        try:
            msgspec.convert({key: entry}, kind)
        except msgspec.ValidationError:
            return f"{out}.{key}"
    return out


def _get(value: Any, at: str | int) -> Any:
    try:
        return value[at]
    except (KeyError, IndexError, TypeError):
        return None


def _unwrapped(kind: Any) -> list[Any]:
    """The kinds a type may be: an Annotated type's own, each of a union's."""
    origin = typing.get_origin(kind)
    if origin is Annotated:
        return _unwrapped(typing.get_args(kind)[0])
    if origin in (typing.Union, types.UnionType):
        return [k for arg in typing.get_args(kind) for k in _unwrapped(arg)]
    return [kind]


def _field_type(kind: Any, name: str) -> Any:
    for k in _unwrapped(kind):
        if isinstance(k, type) and issubclass(k, msgspec.Struct):
            for info in msgspec.structs.fields(k):
                if info.encode_name == name:
                    return info.type
    return None


def _item_type(kind: Any) -> Any:
    for k in _unwrapped(kind):
        if typing.get_origin(k) is list:
            return typing.get_args(k)[0]
    return None


def read(value: Any, kind: type[T], where: str = "") -> T:
    """``value`` (JSON as Python reads it) as ``kind``; raises InvalidRequest naming
    the first field that is not as ``kind`` declares it."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as e:
        raise refusal(e, where, value, kind) from None


def components(kinds: Iterable[type]) -> JSON:
    """The OpenAPI schemas of ``kinds`` and of every type they hold, by name."""
    _, schemas = msgspec.json.schema_components(list(kinds), ref_template=REF)
    declared = {k.__name__: k.__schema__ for k in [*_subclasses(Body), *_subclasses(Answer)]}
    for name, schema in schemas.items():
        schema.pop("title", None)
        if declared.get(name):
            _merge(schema, declared[name])
    return schemas


def _merge(schema: JSON, extra: JSON) -> None:
    """``extra`` into ``schema``; its ``properties`` replace those it names, for what
    a type cannot say (a union of two kinds of array)."""
    for key, value in extra.items():
        if key == "properties":
            schema["properties"].update(value)
        else:
            schema[key] = value


def _subclasses(kind: type[Body] | type[Answer]) -> list[Any]:
    out: list[Any] = []
    sub: Any
    for sub in kind.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out
