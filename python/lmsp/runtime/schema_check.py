"""Whether the grammar of a JSON schema can hold an output to it: each refusal names
the exact keyword.

The schema is read as llama.cpp's converter reads it (``$ref`` first, then
``anyOf``/``oneOf``, a list of types as alternatives, ``const``, ``enum``, then
the type's keywords; without a type the structural keywords decide), and
every part the converter reaches is checked:

- keywords it would skip (so an output could break them) are refused, and so
  are the ones it ignores beside ``$ref`` or ``anyOf``;
- constraints that contradict each other: a minimum over a maximum (string
  lengths, array items, object properties, integers with their exclusive
  bounds), an empty ``enum``, a ``const`` or an ``enum`` value the rest of the
  schema does not admit, a ``required`` property the object's ``properties``
  do not give (the grammar could not make it appear);
- a ``$ref`` cycle with no finite instance (a required property, or an item of
  a non-empty array, that can only be the schema again);
- sizes the grammar cannot hold: a count over :data:`MAX_COUNT`, all counts
  together over :data:`MAX_COUNTS`, an integer bound beyond :data:`MAX_BOUND`.

A refusal is an :class:`~lmsp.errors.InvalidRequest` whose ``param`` is the
keyword's path under the schema's own (``text.format.schema.properties.a.maxLength``).
Pure Python, linear in the schema's size. Patterns are left to the caller
(:attr:`Report.patterns`): whether the converter reads one takes the converter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest

# the most a length or count keyword may ask (the grammar repeats a rule that often)
MAX_COUNT = 1000
# the counts of every part of a schema together (the sampler's setup grows with them)
MAX_COUNTS = 20000
# the deepest a part of a schema may be, in keywords of its path
MAX_DEPTH = 128
# the largest integer bound (the converter holds bounds as 64-bit integers)
MAX_BOUND = 10**15

# keywords the converter would skip, so that an output could break them
UNENFORCED = (
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "contains", "minContains", "maxContains",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "multipleOf", "prefixItems", "$anchor", "$dynamicRef",
)  # fmt: skip
FORMATS = ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
# what a schema asserts of its instance: what the converter ignores beside $ref and anyOf
ASSERTIONS = (
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format", "allOf", *BOUNDS,
)  # fmt: skip

Path = tuple[str | int, ...]


def where(param: str, path: Path) -> str:
    """``param`` and ``path`` as one param: ``schema.properties.a`` , ``schema.anyOf[1]``."""
    out = param
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


@dataclass
class Report:
    """What a schema that passed leaves to the converter: its patterns with their paths."""

    patterns: list[tuple[Path, str]] = field(default_factory=list)


def check(schema: Any, param: str) -> Report:
    """Refuse (InvalidRequest naming the keyword) a schema no output held to its
    grammar could satisfy, or one the grammar would not hold the output to."""
    walk = _Walk(schema, param)
    try:
        walk.run()
    except RecursionError:  # deeper than any schema the depth limit lets through
        raise walk.refuse((), "is nested too deeply") from None
    return walk.report


def type_of(value: Any) -> str:
    """The JSON type of a value (an integral float is an integer, as JSON Schema says)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def admits(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` satisfies the keywords of ``schema`` that the converter drops
    beside ``const``/``enum`` (its type and that type's bounds, an object's properties)."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    actual = type_of(value)
    if isinstance(kinds, list) and actual not in kinds and not (actual == "integer" and "number" in kinds):
        return False
    if actual == "string":
        return _count(schema, "minLength", 0) <= len(value) <= _count(schema, "maxLength", math.inf)
    if actual == "integer" and schema.get("type") == "integer":
        low, high = int_range(schema)
        return low <= value <= high
    if actual == "array":
        return _count(schema, "minItems", 0) <= len(value) <= _count(schema, "maxItems", math.inf)
    if actual == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            return True
        required = schema.get("required")
        if isinstance(required, list) and any(name not in value for name in required):
            return False
        closed = schema.get("additionalProperties") is False
        return all(admits(props[k], v) if isinstance(props.get(k), dict) else not closed for k, v in value.items())
    return True


def int_range(schema: dict[str, Any]) -> tuple[float, float]:
    """The integers an integer schema's bounds admit, as the converter reads them
    (``minimum`` before ``exclusiveMinimum``; a fraction rounded inwards)."""
    low: float = -math.inf
    high: float = math.inf
    if _number(schema.get("minimum")):
        low = math.ceil(schema["minimum"])
    elif _number(schema.get("exclusiveMinimum")):
        low = math.floor(schema["exclusiveMinimum"]) + 1
    if _number(schema.get("maximum")):
        high = math.floor(schema["maximum"])
    elif _number(schema.get("exclusiveMaximum")):
        high = math.ceil(schema["exclusiveMaximum"]) - 1
    return low, high


def _count(schema: dict[str, Any], key: str, default: float) -> float:
    value = schema.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Walk:
    """One check: every node the converter reaches, each ``$ref``'s target once."""

    def __init__(self, root: Any, param: str) -> None:
        self.root = root
        self.param = param
        self.report = Report()
        self.counts = 0
        self.targets: dict[str, tuple[Any, Path]] = {}  # a $ref -> its target and the target's path
        self.uses: list[tuple[str, Path]] = []  # each $ref and where it is
        self.todo: list[tuple[Any, Path]] = []

    def refuse(self, path: Path, why: str) -> InvalidRequest:
        at = where(self.param, path)
        return InvalidRequest(f"'{at}' {why}", param=at)

    def run(self) -> None:
        self.todo.append((self.root, ()))
        while self.todo:
            node, path = self.todo.pop()
            self.node(node, path)
        _Finite(self).check()
        self.left_recursion()

    def left_recursion(self) -> None:
        """Refuse a ``$ref`` that comes back to itself through alternatives and
        references alone: its grammar rule would start with itself (left recursion,
        which the grammar's parser refuses)."""
        edges = {ref: list(_heads(target, path)) for ref, (target, path) in self.targets.items()}
        done: set[str] = set()

        def visit(ref: str, stack: list[str]) -> None:
            if ref in done:
                return
            stack.append(ref)
            for nxt, at in edges.get(ref, ()):
                if nxt in stack:
                    raise self.refuse(at, f"makes {nxt} begin with itself: the grammar cannot hold that")
                visit(nxt, stack)
            stack.pop()
            done.add(ref)

        for ref in edges:
            visit(ref, [])

    def node(self, node: Any, path: Path) -> None:
        if not isinstance(node, dict):
            raise self.refuse(path, "must be a JSON Schema object")
        self.unenforced(node, path)
        if "$ref" in node:
            self.ref(node, path)
        elif "anyOf" in node or "oneOf" in node:
            key = "oneOf" if "oneOf" in node else "anyOf"
            self.ignored(node, path, key)
            alternatives = node[key]
            if not isinstance(alternatives, list) or not alternatives:
                raise self.refuse((*path, key), "must be a non-empty array of schemas")
            self.todo.extend((alt, (*path, key, i)) for i, alt in reversed(list(enumerate(alternatives))))
        elif isinstance(node.get("type"), list):
            kinds = node["type"]
            if not kinds:
                raise self.refuse((*path, "type"), "must not be an empty array")
            for i, kind in enumerate(kinds):
                if kind not in TYPES:
                    raise self.refuse((*path, "type", i), f"must be one of {', '.join(TYPES)}")
            if "const" in node or "enum" in node:  # the same literals in each alternative
                self.typed(node, path)
                return
            for kind in kinds:
                self.typed({**node, "type": kind}, path)
        else:
            self.typed(node, path)

    def unenforced(self, node: dict[str, Any], path: Path) -> None:
        if len(path) > MAX_DEPTH:
            raise self.refuse(path, f"is nested deeper than the grammar holds ({MAX_DEPTH} keywords)")
        self.order(node, path, "minProperties", "maxProperties")
        for key in UNENFORCED:
            if key in node:
                raise self.refuse((*path, key), "is not supported: the grammar would not hold the output to it")
        if node.get("uniqueItems"):
            raise self.refuse((*path, "uniqueItems"), "is not supported: the grammar would not hold the output to it")
        if any(k in node for k in BOUNDS) and node.get("type") != "integer":
            key = next(k for k in BOUNDS if k in node)
            raise self.refuse((*path, key), "is supported for integers only (a schema of 'type': 'integer')")

    def ignored(self, node: dict[str, Any], path: Path, beside: str) -> None:
        """Refuse a keyword the converter drops beside ``$ref`` or ``anyOf``."""
        for key in ASSERTIONS:
            if key in node:
                raise self.refuse((*path, key), f"is not supported beside '{beside}': the grammar would skip it")

    def ref(self, node: dict[str, Any], path: Path) -> None:
        self.ignored(node, path, "$ref")
        ref = node["$ref"]
        at = (*path, "$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise self.refuse(at, "is not supported: only references of the form '#/...' into the schema are")
        self.uses.append((ref, at))
        if ref in self.targets:
            return
        target: Any = self.root
        target_path: Path = ()
        for part in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and part in target:
                target, target_path = target[part], (*target_path, part)
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target, target_path = target[int(part)], (*target_path, int(part))
            else:
                raise self.refuse(at, f"refers to {ref}, which the schema does not have")
        self.targets[ref] = (target, target_path)
        self.todo.append((target, target_path))

    def typed(self, node: dict[str, Any], path: Path) -> None:
        """A node without ``$ref``/``anyOf`` and with one type (or none)."""
        if "const" in node:
            if not admits(node, node["const"]):
                raise self.refuse((*path, "const"), "is not a value the rest of the schema admits")
            return
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise self.refuse((*path, "enum"), "must be a non-empty array: no output could satisfy the schema")
            for i, value in enumerate(values):
                if not admits(node, value):
                    raise self.refuse((*path, "enum", i), "is not a value the rest of the schema admits")
            return
        kind = node.get("type", _inferred(node))
        if kind not in TYPES and kind is not None:
            raise self.refuse((*path, "type"), f"must be one of {', '.join(TYPES)}")
        if "allOf" in node and kind != "object":
            raise self.refuse((*path, "allOf"), "is supported for objects only: the grammar merges their properties")
        visit = {"object": self.object, "array": self.array, "string": self.string, "integer": self.integer}
        if kind in visit:
            visit[kind](node, path)

    def object(self, node: dict[str, Any], path: Path) -> None:
        props = node.get("properties", {})
        if not isinstance(props, dict):
            raise self.refuse((*path, "properties"), "must be an object of schemas")
        if "allOf" in node:
            self.all_of(node, path)
        required = node.get("required", [])
        if not isinstance(required, list):
            raise self.refuse((*path, "required"), "must be an array of property names")
        extra = node.get("additionalProperties", True)
        for i, name in enumerate(required):
            if not isinstance(name, str):
                raise self.refuse((*path, "required", i), "must be a property name")
            if name not in props:
                why = (
                    "additionalProperties: false excludes it" if extra is False else "the grammar cannot make it appear"
                )
                raise self.refuse((*path, "required", i), f"names {name!r}, which 'properties' does not give: {why}")
        if not isinstance(extra, (bool, dict)):
            raise self.refuse((*path, "additionalProperties"), "must be a boolean or a schema")
        if isinstance(extra, dict):
            self.todo.append((extra, (*path, "additionalProperties")))
        self.todo.extend((sub, (*path, "properties", name)) for name, sub in reversed(list(props.items())))

    def all_of(self, node: dict[str, Any], path: Path) -> None:
        """``allOf``: the converter merges object parts (their properties, all required)."""
        parts = node["allOf"]
        if not isinstance(parts, list) or not parts:
            raise self.refuse((*path, "allOf"), "must be a non-empty array of schemas")
        if "properties" in node:
            raise self.refuse((*path, "allOf"), "is not supported beside 'properties': the grammar would skip it")
        for i, part in enumerate(parts):
            merged = isinstance(part, dict) and any(k in part for k in ("$ref", "anyOf", "oneOf", "enum"))
            if not merged and not (isinstance(part, dict) and part.get("type", _inferred(part)) == "object"):
                raise self.refuse((*path, "allOf", i), "must be an object schema: the grammar merges their properties")
        self.todo.extend((part, (*path, "allOf", i)) for i, part in reversed(list(enumerate(parts))))

    def array(self, node: dict[str, Any], path: Path) -> None:
        items = node.get("items", {})
        if isinstance(items, list):
            self.todo.extend((sub, (*path, "items", i)) for i, sub in enumerate(items))
        else:
            self.todo.append((items, (*path, "items")))
        self.counted(node, path, "minItems", "maxItems")

    def string(self, node: dict[str, Any], path: Path) -> None:
        fmt = node.get("format")
        if fmt is not None and fmt not in FORMATS:
            raise self.refuse((*path, "format"), f"{fmt!r} is not supported (only {', '.join(FORMATS[:4])})")
        pattern = node.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$")):
                raise self.refuse((*path, "pattern"), "is not supported: it must start with ^ and end with $")
            self.report.patterns.append(((*path, "pattern"), pattern))
        if fmt is not None or pattern is not None:
            for key in ("minLength", "maxLength"):
                if key in node:
                    raise self.refuse((*path, key), "is not supported beside 'pattern' or 'format'")
        self.counted(node, path, "minLength", "maxLength")

    def integer(self, node: dict[str, Any], path: Path) -> None:
        for key in BOUNDS:
            if key in node:
                value = node[key]
                if not _number(value):
                    raise self.refuse((*path, key), "must be a number")
                if abs(value) > MAX_BOUND:
                    raise self.refuse((*path, key), f"must be within -{MAX_BOUND} and {MAX_BOUND}")
        for inclusive, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if inclusive in node and exclusive in node:
                raise self.refuse((*path, exclusive), f"is not supported beside '{inclusive}': give one of the two")
        low, high = int_range(node)
        if low > high:
            upper = "maximum" if "maximum" in node else "exclusiveMaximum"
            lower = "minimum" if "minimum" in node else "exclusiveMinimum"
            raise self.refuse((*path, upper), f"admits no integer that '{lower}' admits: no output could satisfy it")

    def counted(self, node: dict[str, Any], path: Path, low: str, high: str) -> None:
        """A pair of count keywords: whole numbers, at most MAX_COUNT, in order."""
        for key in (low, high):
            if key not in node:
                continue
            value = node[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise self.refuse((*path, key), "must be a non-negative integer")
            if value > MAX_COUNT:
                raise self.refuse((*path, key), f"is more than the grammar can hold (at most {MAX_COUNT})")
        self.order(node, path, low, high)
        self.counts += max(node.get(low, 0), node.get(high, 0))
        if self.counts > MAX_COUNTS:
            raise self.refuse(
                (*path, high if high in node else low),
                f"brings the schema's lengths and counts together over what the grammar can hold ({MAX_COUNTS})",
            )

    def order(self, node: dict[str, Any], path: Path, low: str, high: str) -> None:
        if isinstance(node.get(low), int) and isinstance(node.get(high), int) and node[low] > node[high]:
            raise self.refuse(
                (*path, high), f"is less than '{low}' ({node[high]} < {node[low]}): no output could satisfy the schema"
            )


def _inferred(node: dict[str, Any]) -> str | None:
    """The type the converter gives a node without one, from its keywords."""
    extra = node.get("additionalProperties", True)
    if "properties" in node or extra is not True or "allOf" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    if any(k in node for k in ("pattern", "minLength", "maxLength", "format")):
        return "string"
    return None


def _heads(node: Any, path: Path) -> list[tuple[str, Path]]:
    """The ``$ref``s an instance of ``node`` may begin with (through alternatives),
    each with where it is."""
    if not isinstance(node, dict):
        return []
    if isinstance(node.get("$ref"), str):
        return [(node["$ref"], (*path, "$ref"))]
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            return [head for i, alt in enumerate(node[key]) for head in _heads(alt, (*path, key, i))]
    return []


class _Finite:
    """Which ``$ref`` targets have a finite instance (a least fixed point over the
    targets), and the refusal of a ``$ref`` to one that has none."""

    def __init__(self, walk: _Walk) -> None:
        self.walk = walk
        self.finite: set[str] = set()

    def check(self) -> None:
        targets = self.walk.targets
        changed = True
        while changed:
            changed = False
            for ref, (target, _) in targets.items():
                if ref not in self.finite and self.has_instance(target):
                    self.finite.add(ref)
                    changed = True
        bad = [(ref, at) for ref, at in self.walk.uses if ref not in self.finite]
        if not bad:
            return
        # blame a $ref inside a target with no instance: where the cycle closes
        cycles = [targets[ref][1] for ref, _ in bad]
        inside = [(ref, at) for ref, at in bad if any(at[: len(p)] == p for p in cycles)]
        ref, at = (inside or bad)[0]
        raise self.walk.refuse(at, f"makes the schema refer to itself with no finite instance ({ref})")

    def has_instance(self, node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if "$ref" in node:
            return node["$ref"] in self.finite
        for key in ("anyOf", "oneOf"):
            if key in node:
                return any(self.has_instance(alt) for alt in node[key])
        if "const" in node or "enum" in node:
            return True
        kind = node.get("type", _inferred(node))
        if isinstance(kind, list):
            return any(self.has_instance({**node, "type": k}) for k in kind)
        if kind == "object":
            props = node.get("properties", {})
            parts = node.get("allOf", []) if "properties" not in node else []
            return all(self.has_instance(props[n]) for n in node.get("required", []) if n in props) and all(
                self.has_instance(p) for p in parts
            )
        if kind == "array":
            items = node.get("items", {})
            if isinstance(items, list):
                return all(self.has_instance(i) for i in items)
            return node.get("minItems", 0) == 0 or self.has_instance(items)
        return True
