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


class GeventWorker(AsyncWorker):
    """``gunicorn.workers.ggevent.GeventWorker``, imported once forked."""

    def init_process(self) -> None:
        from gunicorn.workers.ggevent import GeventWorker as Worker

        self.__class__ = Worker
        Worker.init_process(self)
