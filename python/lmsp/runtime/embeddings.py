"""Embeddings of texts or token ids on a loaded model (``POST /v1/embeddings``).

The engine pools each input by the model's pooling type (mean where the model
declares none) and normalizes it (``Engine.embed``, a llama context of its own
beside the generating one); many inputs go through in one pass. Texts are
tokenized as llama-server tokenizes them: the model's special tokens added,
special-token text parsed. The work runs off the gevent hub.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ContextLengthExceeded, InvalidRequest
from ..hubsafe import offload
from .prompt import check_vocabulary
from .state import WorkerState

if TYPE_CHECKING:
    from ..native import Engine
    from .models import Models


class Embeddings:
    """Embeddings for the API (see the module docstring)."""

    def __init__(self, state: WorkerState, models: Models) -> None:
        self.state = state
        self.models = models

    def embed(self, model_id: str, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        """``{"vectors": [[float...]...], "prompt_tokens": n}`` for the inputs, in order;
        the model is loaded first when it is not. InvalidRequest for a token id outside
        the vocabulary, ContextLengthExceeded for an input longer than the context."""
        engine = self.state.registry.engine(model_id)
        if engine is None:
            self.models.load(model_id)
            engine = self.state.registry.engine(model_id)
            if engine is None:  # unloaded again meanwhile
                engine = offload(self.state.registry.load, model_id)
        tokens = [self._tokens(engine, value, i) for i, value in enumerate(inputs)]
        for i, ids in enumerate(tokens):
            if len(ids) > engine.n_ctx:
                raise ContextLengthExceeded(
                    f"input {i} is {len(ids)} tokens; model {model_id} takes at most {engine.n_ctx}",
                    param=f"input[{i}]" if len(tokens) > 1 else "input",
                )
        vectors = offload(engine.embed, tokens)
        return {"vectors": [list(map(float, row)) for row in vectors], "prompt_tokens": sum(len(t) for t in tokens)}

    @staticmethod
    def _tokens(engine: Engine, value: str | Sequence[int], index: int) -> list[int]:
        if isinstance(value, str):
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
