"""The checks of a request body's fields: each raises
:class:`~lmsp.errors.InvalidRequest` naming the field as the client wrote it
(``param``)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from lmsp.errors import InvalidRequest

_MISSING = object()


def reject_unknown(body: dict[str, Any], allowed: Collection[str], *, where: str = "") -> None:
    for key in body:
        if key not in allowed:
            name = f"{where}{key}"
            raise InvalidRequest(f"unknown field {name!r}", param=name)


# The field getters return Any: the value's type (str, int, float), or whatever the default is.


def get_str(
    body: dict[str, Any],
    name: str,
    *,
    required: bool = False,
    default: Any = None,
    max_len: int = 10_000,
    allow_empty: bool = False,
    param: str | None = None,
) -> Any:
    value = body.get(name, _MISSING)
    param = param or name
    if value is _MISSING or value is None:
        if required:
            raise InvalidRequest(f"{param!r} is required", param=param)
        return default
    if not isinstance(value, str):
        raise InvalidRequest(f"{param!r} must be a string", param=param)
    if not value and not allow_empty:
        raise InvalidRequest(f"{param!r} must not be empty", param=param)
    if len(value) > max_len:
        raise InvalidRequest(f"{param!r} is longer than {max_len} characters", param=param)
    return value


def get_int(
    body: dict[str, Any],
    name: str,
    *,
    default: Any = None,
    minimum: float | None = None,
    maximum: float | None = None,
    param: str | None = None,
) -> Any:
    value = body.get(name, _MISSING)
    param = param or name
    if value is _MISSING or value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{param!r} must be an integer", param=param)
    check_range(value, minimum, maximum, param)
    return value


def get_number(
    body: dict[str, Any],
    name: str,
    *,
    default: Any = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    param: str | None = None,
) -> Any:
    value = body.get(name, _MISSING)
    param = param or name
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{param!r} must be a number", param=param)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond any float
        value = math.inf
    if not math.isfinite(value):
        raise InvalidRequest(f"{param!r} must be a finite number", param=param)
    if exclusive_minimum is not None and value <= exclusive_minimum:
        raise InvalidRequest(f"{param!r} must be greater than {exclusive_minimum}", param=param)
    check_range(value, minimum, maximum, param)
    return value


def get_bool(body: dict[str, Any], name: str, *, default: bool = False, param: str | None = None) -> bool:
    value = body.get(name, _MISSING)
    param = param or name
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{param!r} must be true or false", param=param)
    return value


def check_range(value: float, minimum: float | None, maximum: float | None, param: str) -> None:
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"{param!r} must be at least {minimum}", param=param)
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"{param!r} must be at most {maximum}", param=param)
