"""The service's own history: a row a minute per worker, summed by minute, kept a day."""
from __future__ import annotations

import pytest

from lmsp.store.history import merge_buckets, percentile

DAY = 86400.0


def figures(**kw):
    out = {"tokens": 0, "tasks_finished": 0, "errors": 0, "ttft": None, "running": 0, "db_bytes": None,
           "kv_bytes": None}
    out.update(kw)
    return out


def this_minute(store) -> int:
    return int(store._clock() // 60)


def test_a_minute_written_is_read_back(store, make_task):
    make_task()
    make_task()  # two queued tasks: the box's queue when the row is written
    minute = this_minute(store) - 1
    ttft = [[10.0, 0], [100.0, 3], [1000.0, 1], [None, 0]]
    store.record_minute("w1", minute, figures(tokens=600, tasks_finished=4, errors=1, ttft=ttft, running=2,
                                              db_bytes=4096, kv_bytes=0))
    [row] = store.service_history(60)
    assert row == {"minute": minute, "tokens": 600, "tasks_finished": 4, "errors": 1, "running": 2, "queued": 2,
                   "db_bytes": 4096, "kv_bytes": 0, "model_bytes": 0,
                   "ttft": {10.0: 0, 100.0: 3, 1000.0: 1, None: 0}}


def test_the_workers_of_a_minute_are_summed_and_minutes_come_oldest_first(store):
    minute = this_minute(store) - 2
    store.record_minute("w1", minute, figures(tokens=60, running=1, db_bytes=100, ttft=[[100.0, 1], [None, 0]]))
    store.record_minute("w2", minute, figures(tokens=120, running=3, db_bytes=150, errors=2,
                                              ttft=[[100.0, 1], [None, 1]]))
    store.record_minute("w1", minute + 1, figures(tokens=6))
    first, second = store.service_history(60)
    assert (first["minute"], first["tokens"], first["running"], first["errors"]) == (minute, 180, 4, 2)
    assert first["db_bytes"] == 150  # the box's bytes: the largest a worker saw, not a sum
    assert first["ttft"] == {100.0: 2, None: 1}
    assert (second["minute"], second["tokens"], second["ttft"]) == (minute + 1, 6, {})


def test_a_second_write_of_a_minute_adds_its_counts(store):
    minute = this_minute(store) - 1
    store.record_minute("w1", minute, figures(tokens=10, ttft=[[100.0, 1]]))
    store.record_minute("w1", minute, figures(tokens=5, running=1, ttft=[[100.0, 2]]))
    [row] = store.service_history(5)
    assert (row["tokens"], row["running"], row["ttft"]) == (15, 1, {100.0: 3})


def test_only_the_minutes_asked_for_are_read(store):
    now = this_minute(store)
    for back in (1, 30, 61):
        store.record_minute("w1", now - back, figures(tokens=back))
    assert [row["tokens"] for row in store.service_history(60)] == [30, 1]
    assert [row["tokens"] for row in store.service_history(1)] == [1]
    assert [row["tokens"] for row in store.service_history(1440)] == [61, 30, 1]


def test_retention_keeps_a_day_or_the_configured_retention_when_shorter(store, clock):
    now = this_minute(store)
    for back in (2, 90, 60 * 25):
        store.record_minute("w1", now - back, figures(tokens=back))
    assert store.gc(retention=7 * DAY)["service_history"] == 1  # past a day
    assert [row["tokens"] for row in store.service_history(1440)] == [90, 2]
    assert store.gc(retention=3600.0)["service_history"] == 1  # past the hour kept
    assert [row["tokens"] for row in store.service_history(1440)] == [2]
    clock.advance(DAY)
    assert store.gc(retention=7 * DAY, batch=1)["service_history"] == 1
    assert store.service_history(1440) == []


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        ({}, 0.5, None),
        ({10.0: 0, 100.0: 4, None: 0}, 0.5, 55.0),  # interpolated within its bucket
        ({10.0: 2, 100.0: 2}, 0.5, 10.0),
        ({10.0: 1, 100.0: 0, None: 9}, 0.99, 100.0),  # over the last bound: that bound
        ({None: 3}, 0.5, None),
    ],
)
def test_percentiles_of_a_histogram(buckets, q, expected):
    assert percentile(buckets, q) == expected


def test_histograms_of_other_bounds_merge():
    assert merge_buckets([[[10, 1], [None, 1]], [[10.0, 2], [20.0, 1]]]) == {10.0: 3, None: 1, 20.0: 1}
