"""In-process figures for ``/metrics`` (the web layer renders them)."""

from __future__ import annotations

from ..contracts import EngineTimings

from ._threads import allocate_lock

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 400, 800, 1600)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    def __init__(self, buckets) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def snapshot(self) -> dict:
        """Cumulative buckets, Prometheus style: ``{"buckets": [[le, count], ...], "sum", "count"}``."""
        running, out = 0, []
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append([bound, running])
        return {"buckets": out, "sum": self.sum, "count": self.count}


class Metrics:
    def __init__(self) -> None:
        self._lock = allocate_lock()
        self.tokens_generated = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.finished: dict[str, int] = {}
        self.commits = 0
        self.commit_errors = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.decode_rate = Histogram(RATE_BUCKETS)
        self.commit_time = Histogram(COMMIT_BUCKETS)

    def commit(self, seconds: float, tokens: int) -> None:
        with self._lock:
            self.commits += 1
            self.tokens_generated += tokens
            self.commit_time.observe(seconds)

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def commit_failed(self) -> None:
        with self._lock:
            self.commit_errors += 1

    def finish(self, reason: str, n_prompt: int, n_cached: int | None, timings: EngineTimings | None) -> None:
        """A task's end; ``timings`` as the engine reports them. Its decode rate
        (``tokens_per_s``, the tokens after the first over their time) is 0 for a
        task of one token or none, which has no rate: such a task is not counted."""
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.prompt_tokens += int(n_prompt or 0)
            self.cached_prompt_tokens += int(n_cached or 0)
            rate = (timings or {}).get("tokens_per_s")
            if rate and 0 < rate < float("inf"):
                self.decode_rate.observe(rate)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "tokens_generated": self.tokens_generated,
                "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens,
                "tasks_finished": dict(self.finished),
                "store_commits": self.commits,
                "store_commit_errors": self.commit_errors,
                "ttft_seconds": self.ttft.snapshot(),
                "decode_tokens_per_second": self.decode_rate.snapshot(),
                "store_commit_seconds": self.commit_time.snapshot(),
            }
