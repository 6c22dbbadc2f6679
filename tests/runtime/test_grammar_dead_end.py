"""A task whose grammar allows no next token fails at that step with the code
``grammar_dead_end`` and its ``response.failed`` event (LMSP B.12), on the real
store and the demo model; it neither spins nor runs to ``max_output_tokens``."""
from __future__ import annotations

from runtime_helpers import all_events, check_log, submit, wait_finished

from lmsp.runtime import constraints

# after the brace an empty range: no token can follow
DEAD_END = {"gbnf": 'root ::= "{" [5-2]'}


def test_a_task_whose_grammar_allows_no_next_token_fails_at_once(store, runtime, monkeypatch):
    monkeypatch.setattr(constraints, "grammar", lambda request: DEAD_END)
    task_id = submit(store, runtime, max_output_tokens=60, text={"format": {"type": "json_object"}})
    task = wait_finished(runtime, store, task_id)
    assert task["status"] == "failed"
    events = all_events(store, task_id)
    assert check_log(events)[-1] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "grammar_dead_end"
    assert failed["usage"]["output_tokens"] == 1  # the brace, then the end
    assert store.get_response(task["response_id"])["error"]["code"] == "grammar_dead_end"
