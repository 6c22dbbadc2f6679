"""B.3: service description, health, readiness, metrics; request ids and JSON logs."""
from __future__ import annotations

import io
import json
import logging
import re
import sys

from api_helpers import assert_error

import lmsp
from lmsp.api.logs import JsonFormatter, configure_logging

SAMPLE = re.compile(r'^[a-z_:][a-z0-9_:]*(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+-]+$|^[a-z_]+\{.*\} \+?Inf$',
                    re.IGNORECASE)


def test_service_description(anon, store):
    body = anon.get("/v1/service").json
    assert body["service_id"] == store.identity()["service_id"]
    assert body["protocol"] == "LMSP/1.0" and body["version"] == lmsp.__version__
    assert body["name"] == "lmsp"
    assert "responses" in body["capabilities"] and "responses.background" in body["capabilities"]
    assert anon.get("/v1/service").json == body


def test_health_and_readiness(anon, scripted):
    assert anon.get("/healthz").json == {"status": "ok"}
    assert anon.get("/readyz").json == {"status": "ready"}
    scripted.ready = False
    not_ready = anon.get("/readyz")
    assert_error(not_ready, 503, "unavailable")
    assert not_ready.headers["Retry-After"] == "1"
    assert anon.get("/healthz").status_code == 200


def head_and_get(api, path: str):
    head, get = api.request("HEAD", path), api.get(path)
    assert head.status_code == get.status_code and head.content == b""
    for name in ("Content-Type", "Retry-After", "Cache-Control"):
        assert head.headers.get(name) == get.headers.get(name), name
    return head, get


def test_head_is_get_without_the_body(anon, scripted):
    for path in ("/healthz", "/readyz"):
        head, get = head_and_get(anon, path)
        assert head.status_code == 200 and head.headers["Content-Length"] == str(len(get.content))
    head, get = head_and_get(anon, "/metrics")  # its figures move with every request: only a length
    assert head.status_code == 200 and int(head.headers["Content-Length"]) > 0
    scripted.ready = False
    head, get = head_and_get(anon, "/readyz")
    assert head.status_code == 503 and head.headers["Retry-After"] == "1"
    assert head.headers["Content-Length"] == str(len(get.content))


def test_metrics_exposition(user, anon, scripted):
    scripted.auto = False
    user.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True})
    user.get("/v1/responses")
    result = anon.get("/metrics")
    assert result.status_code == 200
    assert result.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = result.text
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split(" ")[1] in ("HELP", "TYPE")
        else:
            assert SAMPLE.match(line), line
    assert 'lmsp_tasks{state="queued"} 1' in text
    for state in ("loading", "running", "cancelling", "completed", "failed", "cancelled"):
        assert f'lmsp_tasks{{state="{state}"}} ' in text  # finished states too (B.3: tasks by state)
    assert "lmsp_up 1" in text
    assert "lmsp_tokens_generated_total 3" in text
    assert 'lmsp_time_to_first_token_seconds_bucket{le="+Inf"} 2' in text
    assert 'lmsp_http_request_duration_seconds_count{method="POST",route="/v1/responses",code="202"} 1' in text
    assert '# TYPE lmsp_http_request_duration_seconds histogram' in text


def test_request_id_in_and_out(anon):
    made = anon.get("/healthz")
    assert made.headers["X-Request-Id"].startswith("req_")
    kept = anon.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert kept.headers["X-Request-Id"] == "abc-123"
    replaced = anon.get("/healthz", headers={"X-Request-Id": "bad id with spaces"})
    assert replaced.headers["X-Request-Id"].startswith("req_")


def test_access_log_is_json_with_the_request_id(user, caplog):
    with caplog.at_level(logging.INFO, logger="lmsp.access"):
        user.get("/v1/responses", headers={"X-Request-Id": "trace-1"})
    records = [r for r in caplog.records if r.name == "lmsp.access"]
    assert records
    line = JsonFormatter().format(records[-1])
    entry = json.loads(line)
    assert entry["request_id"] == "trace-1" and entry["status"] == 200
    assert entry["route"] == "/v1/responses" and entry["method"] == "GET"
    assert entry["client_id"].startswith("cli_") and entry["level"] == "info"
    assert "\n" not in line


def test_formatter_includes_exceptions_on_one_line():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("lmsp.test").makeRecord("lmsp.test", logging.ERROR, __file__, 1,
                                                            "failed %s", ("x",), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "failed x" and "ValueError: boom" in entry["exc"]


def test_configure_logging_writes_json_lines():
    stream = io.StringIO()
    logger = logging.getLogger("lmsp")
    before = list(logger.handlers), logger.level, logger.propagate
    try:
        configure_logging("info", stream=stream)
        configure_logging("info", stream=stream)  # idempotent: one handler
        logging.getLogger("lmsp.api").info("hello", extra={"task_id": "task_1"})
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
        logger.propagate = before[2]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["msg"] == "hello" and entry["task_id"] == "task_1" and entry["logger"] == "lmsp.api"
