"""The worker runtime: scheduler and commit path between the store and the engine.

``Runtime`` is what ``lmsp.app.create_app(config, store, runtime)`` receives.
``prepare`` runs once per service start (the gunicorn master, or
``Runtime.start()`` when serving without gunicorn).
"""

from .core import RECOVERED_ENV, Runtime
from .prompt import messages_for, render, sampling
from .model_files import file_digest
from .registry import ModelRegistry, model_object
from .startup import bootstrap_admin, open_store, prepare

__all__ = [
    "RECOVERED_ENV",
    "ModelRegistry",
    "Runtime",
    "bootstrap_admin",
    "file_digest",
    "messages_for",
    "model_object",
    "open_store",
    "prepare",
    "render",
    "sampling",
]
