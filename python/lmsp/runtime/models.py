"""The model operations of one worker, in step with the runs on its engines.

The registry (:mod:`.registry`) holds the models' files, metadata and this
process's engines; this room loads, unloads and deletes them on behalf of the
API, never under a run: unloading (or deleting) a model checks that no task of
this worker uses it and takes its engine out of the registry in one step under
the lock a task's start takes to submit, so a task arriving meanwhile loads the
model again. A model deleted while one of its runs ends here is unloaded once
its runs have ended (the commit thread's lease rounds call
:meth:`Models.close_deleted`). Blocking work (hashing, loading) runs off the
gevent hub.

A loaded model whose file changes is unloaded, and the tasks on it fail. The
registry keeps the identity of each loaded model's file; it is checked before a
task starts on the model, when a request asks for the model, and by the janitor
thread (at once when inotify reports a change, else every few seconds). A model
whose file changed is taken out of the registry (nothing new starts on it),
recorded ``changed`` in the store (its registered digest stays: a load serves it
again only from a file with that digest), and its engine is closed; the tasks
that ran on it end ``failed`` with ``model_changed`` (the commit thread writes
their ends), and tasks queued for it fail the same way when their start finds
the file's digest changed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import InvalidRequest, ModelChanged, ModelInUse
from lmsp.serving.hubsafe import offload
from .prompt import check_vocabulary
from .registry import CHANGED, MISSING
from .state import WorkerState

if TYPE_CHECKING:
    from ..native import Engine

log = logging.getLogger("lmsp.runtime")


class Models:
    """The model room (see the module docstring)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.registry = state.registry
        self.store = state.store
        self.close_when_idle: set[str] = set()  # deleted models still in use here (under the lock)

    # ---------------------------------------------------------------- what the API asks
    def register(
        self,
        path: str,
        model_id: str | None = None,
        progress: Callable[..., Any] | None = None,
        *,
        confined: bool = True,
        rpc_servers: list[str] | None = None,
        tensor_split: list[float] | None = None,
    ) -> dict[str, Any]:
        return offload(
            self.registry.register,
            path,
            model_id,
            progress,
            confined=confined,
            rpc_servers=rpc_servers,
            tensor_split=tensor_split,
        )

    def load(self, model_id: str) -> dict[str, Any]:
        offload(self.registry.load, model_id)
        return self.registry.object(model_id)

    def engine(self, model_id: str) -> Engine:
        """The model's engine in this worker, loaded first when it is not."""
        engine = self.registry.engine(model_id)
        if engine is None:
            self.load(model_id)
            engine = self.registry.engine(model_id)
            if engine is None:  # unloaded again meanwhile
                engine = offload(self.registry.load, model_id)
        return engine

    def detokenize(self, model_id: str, tokens: Sequence[int]) -> str:
        """The text of token ids (a completion's echoed prompt); InvalidRequest for an id
        outside the model's vocabulary."""
        engine = self.engine(model_id)
        try:
            check_vocabulary(list(tokens), engine.n_vocab)
        except ValueError as exc:
            raise InvalidRequest(f"'prompt': {exc}", param="prompt") from None
        return str(engine.detokenize(list(tokens)))

    def prompt_pieces(self, model_id: str, prompt: str | Sequence[int]) -> list[bytes]:
        """The bytes of each token of a completion's prompt, tokenized as the task
        tokenizes it (a control token's are none); InvalidRequest for an id outside
        the model's vocabulary."""
        engine = self.engine(model_id)
        if isinstance(prompt, str):
            tokens = list(engine.tokenize(prompt, add_special=True, parse_special=True))
        else:
            tokens = [int(t) for t in prompt]
            try:
                check_vocabulary(tokens, engine.n_vocab)
            except ValueError as exc:
                raise InvalidRequest(f"'prompt': {exc}", param="prompt") from None
        return [bytes(engine.token_bytes(t)) for t in tokens]

    def unload(self, model_id: str) -> dict[str, Any]:
        self.store.get_model(model_id)  # NotFound
        engine = self.detach_engine(model_id)
        if engine is not None:
            offload(self.registry.close_engine, model_id, engine)
        return self.registry.object(model_id)

    def delete(self, model_id: str) -> None:
        """Delete a model (NotFound; ModelInUse while this worker runs tasks on it)."""
        self.store.get_model(model_id)
        with self.state.lock:
            self.check_idle(model_id)
        offload(self._delete, model_id)

    def _delete(self, model_id: str) -> None:
        self.store.delete_model(model_id)  # ModelInUse while unfinished tasks need it
        try:
            engine = self.detach_engine(model_id)
        except ModelInUse:  # a task that started meanwhile ends on it first
            with self.state.lock:
                self.close_when_idle.add(model_id)
            log.info("model %s deleted while a task runs on it; it unloads when its tasks end", model_id)
            return
        if engine is not None:
            self.registry.close_engine(model_id, engine)

    def object(self, model_id: str) -> dict[str, Any]:
        found = self.registry.object(model_id)
        self.retire_if_changed([found])
        return found

    def objects(self) -> list[dict[str, Any]]:
        found = self.registry.objects()
        self.retire_if_changed(found)
        return found

    # ---------------------------------------------------------------- engines and runs
    def close_deleted(self) -> None:
        """Unload the engines of deleted models whose last tasks have ended (commit thread)."""
        with self.state.lock:
            pending = list(self.close_when_idle)
        for model_id in pending:
            try:
                engine = self.detach_engine(model_id)
            except ModelInUse:
                continue
            with self.state.lock:
                self.close_when_idle.discard(model_id)
            if engine is not None:
                self.registry.close_engine(model_id, engine)

    def detach_engine(self, model_id: str) -> Engine | None:
        """The model's engine, out of the registry once no task of this worker uses
        it (ModelInUse otherwise): one step under the lock a task's start takes to
        submit, so no task can start on an engine about to close."""
        with self.state.lock:
            self.check_idle(model_id)
            return self.registry.detach(model_id)

    def check_idle(self, model_id: str) -> None:
        """ModelInUse while this worker runs or starts tasks on the model (under the lock)."""
        if any(r.model == model_id for r in (*self.state.runs.values(), *self.state.early)):
            raise ModelInUse(f"model {model_id} is generating; cancel its tasks or wait for them")

    # ---------------------------------------------------------------- changed files
    def retire_if_changed(self, models: list[dict[str, Any]]) -> None:
        """Unload the models shown changed (or missing) that are still loaded here."""
        for model in models:
            if model["state"] in (CHANGED, MISSING) and self.registry.engine(model["id"]) is not None:
                offload(self.retire_changed, model["id"])

    def check_files(self) -> list[str]:
        """Unload the models loaded here whose files changed; their ids."""
        self.registry.drain_watch()
        changed = self.registry.changed_files()
        for model_id in changed:
            self.retire_changed(model_id)
        return changed

    def retire_changed(self, model_id: str) -> bool:
        """The file of ``model_id`` changed while it was loaded here: unload it, end its
        tasks here with ``model_changed``. False when it was not loaded (any more)."""
        message = (
            f"the file of model {model_id} changed while the model was loaded; register it again to serve the new file"
        )
        if self.registry.engine(model_id) is None:
            return False
        self.registry.mark_changed(model_id)  # first: once unloaded, the model shows its stored state
        state = self.state
        with state.lock:  # the lock a task's start takes to submit: none starts on it from now on
            engine = self.registry.detach(model_id)
            if engine is None:
                return False
            for run in (*state.runs.values(), *state.early):
                if run.engine is engine:
                    run.failure = (ModelChanged.code, message)
        log.warning("the file of model %s changed while it was loaded: unloading it", model_id)
        try:
            self.registry.close_engine(model_id, engine)  # its sequences stop with its thread
        finally:
            state.orphans_due = True  # the commit thread ends their tasks
            state.commit_wake.set()
        return True
