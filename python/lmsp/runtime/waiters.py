"""Wake the requests that wait for a task's next committed events.

A waiter registers for a task *before* it checks the store, so a commit is
never missed: a commit made before the registration is visible in the store,
one made after it wakes the waiter. The commit thread calls :meth:`notify`
after each COMMIT; it never touches a greenlet directly: under gevent the
wake-up goes through the hub's async watcher (thread-safe ``send()``), with
plain threads through an OS lock used as a one-shot event.
"""

from __future__ import annotations

from typing import Any

from ._threads import allocate_lock, gevent_active


class _ThreadWaiter:
    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._lock.acquire()
        self._set = False

    def wake(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:  # released by a concurrent wake
                pass

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(True, max(0.0, timeout))


class _GeventWaiter:
    __slots__ = ("event", "_owner")

    def __init__(self, owner: "CommitWaiters") -> None:
        from gevent.event import Event

        self.event = Event()
        self._owner = owner

    def wake(self) -> None:  # from any thread
        self._owner._hub_wake(self)

    def wait(self, timeout: float) -> bool:
        return self.event.wait(max(0.0, timeout))


Waiter = _ThreadWaiter | _GeventWaiter


class CommitWaiters:
    """Per-task wait lists, woken after the commits that touch the task."""

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._waiting: dict[str, set[Waiter]] = {}
        self._async: Any = None  # the hub's async watcher (gevent only)
        self._hub_pending: list[_GeventWaiter] = []
        self.generation = 0  # +1 at every notify (read without the lock: an int is atomic)
        self.closed = False  # the worker stops: every wait returns at once

    def register(self, task_id: str) -> Waiter:
        waiter: Waiter
        if gevent_active():
            self._ensure_async()
            waiter = _GeventWaiter(self)
        else:
            waiter = _ThreadWaiter()
        with self._lock:
            self._waiting.setdefault(task_id, set()).add(waiter)
            closed = self.closed
        if closed:
            waiter.wake()
        return waiter

    def close(self) -> None:
        """Wake every waiter, now and from now on (the worker stops: its streams end)."""
        with self._lock:
            self.closed = True
            self.generation += 1
            fire = [waiter for group in self._waiting.values() for waiter in group]
        for waiter in fire:
            waiter.wake()

    def unregister(self, task_id: str, waiter) -> None:
        with self._lock:
            group = self._waiting.get(task_id)
            if group is not None:
                group.discard(waiter)
                if not group:
                    del self._waiting[task_id]

    def notify(self, task_ids) -> None:
        """Wake everyone waiting on these tasks (any thread)."""
        fire: list[Waiter] = []
        with self._lock:
            self.generation += 1
            for task_id in task_ids:
                group = self._waiting.get(task_id)
                if group:
                    fire.extend(group)
        for waiter in fire:
            waiter.wake()

    def waiting(self) -> int:
        with self._lock:
            return sum(len(g) for g in self._waiting.values())

    # gevent: the hub's loop runs the callback in the hub thread
    def _ensure_async(self) -> None:
        if self._async is None:
            import gevent

            watcher = gevent.get_hub().loop.async_(ref=False)
            watcher.start(self._drain_hub)
            self._async = watcher

    def _hub_wake(self, waiter: _GeventWaiter) -> None:
        with self._lock:
            self._hub_pending.append(waiter)
        self._async.send()

    def _drain_hub(self) -> None:
        with self._lock:
            pending, self._hub_pending = self._hub_pending, []
        for waiter in pending:
            waiter.event.set()
