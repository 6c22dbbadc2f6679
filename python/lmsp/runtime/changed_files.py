"""A loaded model whose file changes is unloaded, and the tasks on it fail.

Part of :class:`lmsp.runtime.Runtime` (a base class of it, using its lock, its
runs and its registry). The registry keeps the identity of each loaded model's
file; it is checked before a task starts on the model, when a request asks for
the model, and by the janitor thread (at once when inotify reports a change,
else every ``FILE_CHECK_SECONDS``). A model whose file changed is taken out of
the registry (nothing new starts on it), recorded ``changed`` in the store (its
registered digest stays: a load serves it again only from a file with that
digest), and its engine is closed; the tasks that ran on it end ``failed`` with
``model_changed`` (the commit thread writes their ends), and tasks queued for it
fail the same way when their start finds the file's digest changed.
"""
from __future__ import annotations

import logging

from ..errors import ModelChanged

log = logging.getLogger("lmsp.runtime")


class ChangedFiles:
    """The model-file checks of the runtime (see the module docstring)."""

    def check_model_files(self) -> list[str]:
        """Unload the models loaded here whose files changed; their ids."""
        self.registry.drain_watch()
        changed = self.registry.changed_files()
        for model_id in changed:
            self.retire_changed(model_id)
        return changed

    def retire_changed(self, model_id: str) -> bool:
        """The file of ``model_id`` changed while it was loaded here: unload it, end its
        tasks here with ``model_changed``. False when it was not loaded (any more)."""
        message = (f"the file of model {model_id} changed while the model was loaded; "
                   "register it again to serve the new file")
        if self.registry.engine(model_id) is None:
            return False
        self.registry.mark_changed(model_id)  # first: once unloaded, the model shows its stored state
        with self.state.lock:  # the lock a task's start takes to submit: none starts on it from now on
            engine = self.registry.detach(model_id)
            if engine is None:
                return False
            for run in (*self.state.runs.values(), *self.state.early):
                if run.engine is engine:
                    run.failure = (ModelChanged.code, message)
        log.warning("the file of model %s changed while it was loaded: unloading it", model_id)
        try:
            self.registry.close_engine(model_id, engine)  # its sequences stop with its thread
        finally:
            self.state.orphans_due = True  # the commit thread ends their tasks
            self.state.commit_wake.set()
        return True
