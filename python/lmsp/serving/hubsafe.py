"""Keep store waits off the gevent hub.

SQLite waits for a lock held by another process inside ``sqlite3_step`` for
up to the busy timeout. In a gevent worker that wait would freeze every
greenlet of the process. :func:`hub_safe` wraps the store so that, while gevent
has patched ``threading``, each write runs in the hub's thread pool (a real OS
thread; ``sqlite3`` releases the GIL while it waits) and only the calling
greenlet waits. A read (``Store.READS``) in WAL mode almost never meets a
lock, so it runs on the hub itself under :func:`lmsp.store.db.no_wait` (no
hand-over to a thread and back) and goes to the pool only when it does meet
one. Outside gevent the store is returned unchanged. :func:`offload` and
:func:`offload_bounded` (which waits only so long) do the same for other
blocking calls.
"""

from __future__ import annotations

import functools
from typing import Any


def gevent_active() -> bool:
    """True when ``threading`` is patched by gevent (a gevent worker)."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return False
    return bool(monkey.is_module_patched("threading"))


def _capture(fn, args, kwargs):
    # Exceptions come back as values: gevent's pool would otherwise print
    # the traceback of every expected error (404, 409...) to the log.
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:  # re-raised in the calling greenlet
        return False, exc


def _in_pool(pool, fn, args, kwargs):
    ok, value = pool.apply(_capture, (fn, args, kwargs))
    if ok:
        return value
    raise value


def offload(fn, *args, **kwargs):
    """Call ``fn`` in the hub's thread pool under gevent; directly otherwise."""
    if not gevent_active():
        return fn(*args, **kwargs)
    import gevent

    return _in_pool(gevent.get_hub().threadpool, fn, args, kwargs)


_bounded_pool = None  # the threads of offload_bounded outside gevent, made on first use


def offload_bounded(timeout: float, fn, *args, **kwargs):
    """Call ``fn`` in another thread (the hub's pool under gevent) and wait for it at
    most ``timeout`` seconds: TimeoutError past that (the call runs on; its result is
    dropped). For native work that releases the GIL but must not hold a request
    for long."""
    global _bounded_pool
    if gevent_active():
        import gevent

        pending = gevent.get_hub().threadpool.spawn(_capture, fn, args, kwargs)
        try:
            outcome: Any = pending.get(timeout=timeout)
        except gevent.Timeout:
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {timeout} s") from None
    else:
        import concurrent.futures

        if _bounded_pool is None:
            _bounded_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="lmsp-bounded")
        future = _bounded_pool.submit(_capture, fn, args, kwargs)
        try:
            outcome = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {timeout} s") from None
    ok, value = outcome
    if ok:
        return value
    raise value


class HubSafeStore:
    """A proxy whose method calls run in gevent's thread pool."""

    def __init__(self, store) -> None:
        import gevent

        self._store = store
        self._pool = gevent.get_hub().threadpool

    @property
    def wrapped(self):
        return self._store

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        pool = self._pool
        if name in getattr(self._store, "READS", ()):
            from lmsp.errors import Unavailable
            from lmsp.store.db import no_wait

            @functools.wraps(attr)
            def call(*args, **kwargs):
                try:
                    with no_wait():
                        return attr(*args, **kwargs)
                except Unavailable:  # a lock: wait for it in the pool
                    return _in_pool(pool, attr, args, kwargs)
        else:

            @functools.wraps(attr)
            def call(*args, **kwargs):
                return _in_pool(pool, attr, args, kwargs)

        setattr(self, name, call)  # made once per method; later lookups skip __getattr__
        return call


def hub_safe(store):
    """``store`` itself, or a :class:`HubSafeStore` around it under gevent."""
    return HubSafeStore(store) if gevent_active() else store
