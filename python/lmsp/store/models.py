"""The store's models: the metadata of the model files the service knows (never
the files), and the state the registry reports for each."""

from __future__ import annotations

import json

from .. import objects as obj
from ..contracts import MODEL_STATES
from ..errors import InvalidRequest, ModelInUse, NotFound
from .base import UNFINISHED_SQL, StoreBase


class ModelsArea(StoreBase):
    """The ``models`` table."""

    def put_model(self, model: dict) -> dict:
        """Insert or update a model's metadata (never the file); returns it with its path."""
        try:
            values = (
                str(model["id"]),
                str(model["path"]),
                str(model["digest"]),
                int(model["size_bytes"]),
                model.get("format") or "gguf",
                model.get("architecture"),
                model.get("parameters"),
                model.get("quantization"),
                model.get("context_length"),
                model.get("state") or "available",
            )
            template = model.get("has_chat_template")
            template = None if template is None else int(bool(template))
            split = json.dumps(model["rpc_split"]) if model.get("rpc_split") else None
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"incomplete model metadata: {exc}") from exc
        if values[-1] not in MODEL_STATES:
            raise InvalidRequest(f"unknown model state {values[-1]!r}", param="state")
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO models (id, path, digest, size_bytes, format, architecture, parameters, quantization,"
                " context_length, state, chat_template, rpc_split, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(id) DO UPDATE SET"
                " path=excluded.path, digest=excluded.digest, size_bytes=excluded.size_bytes,"
                " format=excluded.format, architecture=excluded.architecture, parameters=excluded.parameters,"
                " quantization=excluded.quantization, context_length=excluded.context_length,"
                " state=excluded.state, chat_template=excluded.chat_template, rpc_split=excluded.rpc_split",
                values + (template, split, self._clock()),
            )
            row = conn.execute("SELECT * FROM models WHERE id = ?", (values[0],)).fetchone()
        return obj.model_object(row, with_path=True)

    def get_model(self, model_id: str) -> dict:
        with self._db.read() as conn:
            row = conn.execute("SELECT * FROM models WHERE id = ?", (model_id,)).fetchone()
        if row is None:
            raise NotFound(f"no model {model_id}")
        return obj.model_object(row, with_path=True)

    def list_models(self) -> list[dict]:
        with self._db.read() as conn:
            return [obj.model_object(r, with_path=True) for r in conn.execute("SELECT * FROM models ORDER BY id")]

    def set_model_state(self, model_id: str, state: str) -> None:
        if state not in MODEL_STATES:
            raise InvalidRequest(f"unknown model state {state!r}", param="state")
        with self._db.write() as conn:
            if conn.execute("UPDATE models SET state = ? WHERE id = ?", (state, model_id)).rowcount == 0:
                raise NotFound(f"no model {model_id}")

    def delete_model(self, model_id: str) -> None:
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM models WHERE id = ?", (model_id,)).fetchone() is None:
                raise NotFound(f"no model {model_id}")
            if conn.execute(
                f"SELECT 1 FROM tasks WHERE model = ? AND status IN {UNFINISHED_SQL} LIMIT 1", (model_id,)
            ).fetchone():
                raise ModelInUse(f"model {model_id} is needed by unfinished tasks")
            conn.execute("DELETE FROM models WHERE id = ?", (model_id,))
