"""Embeddings of texts or token ids on a loaded model (``POST /v1/embeddings``).

The engine pools each input by the model's pooling type (mean where the model
declares none) and normalizes it (``Engine.embed``, a llama context of its own
beside the generating one); many inputs go through in one pass. Texts are
tokenized as llama-server tokenizes them: the model's special tokens added,
special-token text parsed. For a WordPiece vocabulary that strips accents
(BERT's), a text is decomposed (NFD) in full first, as the model's own
tokenizer does: llama.cpp's decomposition leaves Hangul syllables whole.

A request's embeddings are a task of the store, as every request is (LMSP
B.11): once its inputs are checked, the task is created already claimed by this
worker and ``running`` (no scheduler runs it: the request computes it, off the
gevent hub, while the commit thread renews its lease), then ends ``completed``
with its usage, or ``failed``, and is deleted (nothing of it is kept). Its
restart policy is ``fail``: a worker that dies under it leaves it to recovery.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ContextLengthExceeded, InvalidRequest, LMSPError, ModelLoadFailed
from lmsp.serving.hubsafe import offload
from .prompt import check_vocabulary
from .rpc import BACKEND_LOST
from .state import WorkerState

if TYPE_CHECKING:
    from ..native import Engine
    from .models import Models

log = logging.getLogger("lmsp.runtime")


class Embeddings:
    """Embeddings for the API (see the module docstring)."""

    def __init__(self, state: WorkerState, models: Models) -> None:
        self.state = state
        self.models = models

    def embed(
        self,
        model_id: str,
        inputs: Sequence[str | Sequence[int]],
        *,
        client_id: str | None = None,
        max_unfinished: int | None = None,
    ) -> dict[str, Any]:
        """``{"vectors": [[float...]...], "prompt_tokens": n}`` for the inputs, in order;
        the model is loaded first when it is not. InvalidRequest for a token id outside
        the vocabulary, ContextLengthExceeded for an input longer than the context (no
        task is made for either); ``max_unfinished``: the client's cap on its unfinished
        tasks (RateLimited beyond)."""
        engine = self.models.engine(model_id)
        tokens = [self._tokens(engine, value, i) for i, value in enumerate(inputs)]
        for i, ids in enumerate(tokens):
            if len(ids) > engine.n_ctx:
                raise ContextLengthExceeded(
                    f"input {i} is {len(ids)} tokens; model {model_id} takes at most {engine.n_ctx}",
                    param=f"input[{i}]" if len(tokens) > 1 else "input",
                )
        n = sum(len(t) for t in tokens)
        task_id, response_id = self._begin(model_id, len(tokens), n, client_id, max_unfinished)
        try:
            try:
                vectors = offload(engine.embed, tokens)
            except Exception as exc:
                lost = str(getattr(engine, "backend_lost", "") or "")  # an RPC server lost as it ran
                code, message = (BACKEND_LOST, lost) if lost else ("server_error", f"embeddings failed: {exc}")
                self._end(task_id, "error", error={"code": code, "message": message})
                if not lost:
                    raise
                offload(self.models.registry.lose, model_id, engine, lost)
                raise ModelLoadFailed(f"model {model_id} is unavailable: {lost}", unreachable=True) from None
            outcome = self._end(task_id, "stop", usage={"input_tokens": n, "output_tokens": 0})
        finally:
            with self.state.lock:
                self.state.held.discard(task_id)
            self._forget(response_id)
        if task_id in outcome.get("cancelled", ()):
            cancelled = LMSPError(f"the embeddings' task {task_id} was cancelled", code="cancelled")
            cancelled.status = 409
            raise cancelled
        return {"vectors": [list(map(float, row)) for row in vectors], "prompt_tokens": n, "task_id": task_id}

    def _begin(
        self, model_id: str, count: int, n: int, client_id: str | None, max_unfinished: int | None
    ) -> tuple[str, str]:
        """The task, created ``running`` and claimed here, its lease renewed by the commit thread."""
        state = self.state
        request = {"model": model_id, "inputs": count, "input_tokens": n, "store": False, "on_restart": "fail"}
        created = offload(
            state.store.create_task,
            client_id=client_id,
            model=model_id,
            request=request,
            on_restart="fail",
            background=False,
            stream=False,
            claim=(state.owner, state.lease),
            max_unfinished=max_unfinished,
            kind="embedding",
        )
        assert created["task"] is not None and created["response"] is not None
        task_id = created["task"]["id"]
        with state.lock:
            state.held.add(task_id)
        return task_id, created["response"]["id"]

    def _end(self, task_id: str, finish: str, **fields: Any) -> dict[str, Any]:
        item = {"task_id": task_id, "finish": finish, **fields}
        return dict(offload(self.state.store.append_step, self.state.owner, [item]))

    def _forget(self, response_id: str) -> None:
        try:
            offload(self.state.store.delete_response, response_id)
        except LMSPError as exc:  # not ended (its end was not written): recovery ends it
            log.warning("embeddings' response %s not deleted: %s", response_id, exc.message)

    @staticmethod
    def _tokens(engine: Engine, value: str | Sequence[int], index: int) -> list[int]:
        if isinstance(value, str):
            if engine.info.get("decomposes_text"):
                value = unicodedata.normalize("NFD", value)
            ids = list(engine.tokenize(value, add_special=True, parse_special=True))
        else:
            ids = [int(t) for t in value]
            try:
                check_vocabulary(ids, engine.n_vocab)
            except ValueError as exc:
                raise InvalidRequest(f"input {index}: {exc}", param="input") from None
        if not ids:
            raise InvalidRequest(f"input {index} has no tokens", param="input")
        return ids
