"""Structured logs: one JSON object per line, with the request id when there is one."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import TextIO

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("lmsp_request_id", default=None)

# Attributes every LogRecord has; anything else passed through ``extra=`` is
# written as a field of the JSON object.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send the ``lmsp`` loggers to ``stream`` (stderr) as JSON lines."""
    logger = logging.getLogger("lmsp")
    logger.setLevel(level.upper())
    for handler in logger.handlers:
        if getattr(handler, "_lmsp_json", False):
            return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._lmsp_json = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
