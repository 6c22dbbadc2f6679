"""The invariant checker itself, on a database the real store wrote (no service)."""
from __future__ import annotations

import sqlite3

from rel_checker import StoreView, check_log

from lmsp.store import Store

REQUEST = {"model": "tiny", "input": "hello", "max_output_tokens": 8, "seed": 1}


def failed_task(path) -> str:
    store = Store.open(path)
    try:
        tid = store.create_task(client_id="cli_a", model="tiny", request=REQUEST, on_restart="fail",
                                background=True, stream=False)["task"]["id"]
        store.claim("w1", limit=1, lease=30)
        store.fail_task(tid, "w1", code="model_load_failed", message="bad file")
    finally:
        store.close()
    return tid


def test_a_failed_event_with_a_top_level_error_is_a_violation(tmp_path):
    path = tmp_path / "lmsp.db"
    tid = failed_task(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert check_log(StoreView.load(conn)) == []
        conn.execute("UPDATE task_events SET data = json_set(data, '$.error', json(?)) "
                     "WHERE task_id = ? AND type = 'response.failed'",
                     ('{"code": "model_load_failed", "message": "bad file"}', tid))
        violations = check_log(StoreView.load(conn))
    finally:
        conn.close()
    assert [(v.kind, v.task_id) for v in violations] == [("failed_error", tid)]
