"""gunicorn's gevent worker, with gevent imported in the worker process only.

gunicorn builds each worker object in the master and then forks, so naming
``gevent`` as the worker class imports gevent into the master (about 20 MB of
its resident memory on CPython 3.11), where it never runs: the master serves
no request. :class:`GeventWorker` is gunicorn's own gevent worker, loaded
after the fork. Until then the object is an ``AsyncWorker``, the class
gunicorn's gevent worker is built on (same constructor, no gevent), and
``init_process``, the first thing a forked worker runs, makes it the real
one and continues as it.
"""
from __future__ import annotations

from gunicorn.workers.base_async import AsyncWorker


_draining_class = None


def _draining(worker_class):
    """gunicorn's gevent worker, which on SIGTERM (a stop, a reload's old worker)
    first tells this process's runtimes to claim no more tasks: its connections
    may keep it alive for gunicorn's whole graceful timeout, and a task it
    claimed meanwhile would wait for its lease to run out instead of going to
    another worker at once."""
    global _draining_class
    if _draining_class is None:
        class Draining(worker_class):
            def handle_exit(self, sig, frame) -> None:
                from lmsp.runtime import core

                for runtime in core.started():
                    runtime.drain()
                super().handle_exit(sig, frame)

        Draining.__name__ = Draining.__qualname__ = worker_class.__name__
        _draining_class = Draining
    return _draining_class


class GeventWorker(AsyncWorker):
    """``gunicorn.workers.ggevent.GeventWorker``, imported once forked."""

    def init_process(self) -> None:
        from gunicorn.workers.ggevent import GeventWorker as Worker

        self.__class__ = _draining(Worker)
        Worker.init_process(self)
