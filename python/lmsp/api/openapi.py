"""The OpenAPI 3.1 document of the API (placeholder, filled below)."""
from __future__ import annotations


def document() -> dict:
    return {"openapi": "3.1.0", "info": {"title": "lmsp", "version": "0.1.0"}, "paths": {}}
