"""The operator's console in a real browser (Debian's Chromium, driven by selenium with
Debian's chromedriver; nothing is downloaded) against a real ``lmsp serve`` with the demo
model: an admin sees the models and a queued task with its position, cancels it from the
page and streams an answer in the playground; a ``models:read`` token sees neither cancel
nor revoke, and the API refuses them anyway. Screenshots of each view go under the test's
tmp_path."""
from __future__ import annotations

import pytest
from console_helpers import chromium, log_in, queue_row, require_chromium, screenshot, text
from e2e_helpers import Server
from selenium.webdriver.common.by import By

LONG = {"model": "tiny", "input": "Count on:", "background": True, "max_output_tokens": 1500, "temperature": 0}


@pytest.fixture(scope="module")
def console(tmp_path_factory, demo_model_path):
    require_chromium()
    root = tmp_path_factory.mktemp("console")
    server = Server(root / "data", root, demo_model_path, {"LMSP_N_PARALLEL": "1"}).start()
    yield server, root
    server.stop(timeout=10)


@pytest.fixture
def browser(console):
    with chromium(console[1] / "chromium") as driver:
        yield driver


def test_an_admin_sees_models_and_the_queue_cancels_a_task_and_streams_an_answer(console, browser, tmp_path):
    server, _ = console
    admin = server.pair(scopes="admin", name="operator")
    wait = log_in(browser, server, admin)
    assert "admin" in text(browser, "scopes")
    wait.until(lambda d: "tiny" in text(d, "models") and "generation" in text(d, "models"))
    screenshot(browser, tmp_path, "models")

    # a client that may start nothing (max_running 0): its tasks stay queued
    batch = server.pair(scopes="responses:write,responses:read", name="batch")
    batch_id = next(c["id"] for c in server.call("GET", "/v1/clients", token=admin)["data"] if c["name"] == "batch")
    server.call("PATCH", f"/v1/clients/{batch_id}", {"max_running": 0}, token=admin)
    first, second = (server.call("POST", "/v1/responses", LONG, token=batch, expect=202)["task"]["id"] for _ in "12")
    wait.until(lambda d: (queue_row(d, second) or ["", ""])[1] == "queued")
    cells, ahead = queue_row(browser, second), queue_row(browser, first)
    # its client and model, its place after the first
    assert cells[2] == batch_id and cells[3] == "tiny" and int(cells[5]) > int(ahead[5]) >= 1
    screenshot(browser, tmp_path, "queue")
    # the table is redrawn every 2 s: a button found just before a redraw is gone
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"#queue tr[data-task='{second}'] button").click() or True)
    server.wait_task(batch, second, lambda t: t["status"] == "cancelled", timeout=30)
    server.call("POST", f"/v1/tasks/{first}/cancel", token=batch)
    queued_id = second
    wait.until(lambda d: queue_row(d, queued_id) is None)

    assert browser.find_element(By.ID, "clients-view").is_displayed()
    assert "operator" in text(browser, "clients")
    assert browser.find_elements(By.XPATH, "//table[@id='clients']//button[text()='revoke']")
    screenshot(browser, tmp_path, "clients")

    browser.find_element(By.ID, "play-max").clear()
    browser.find_element(By.ID, "play-max").send_keys("24")
    browser.find_element(By.ID, "play-input").send_keys("Hello")
    browser.find_element(By.ID, "play-send").click()
    wait.until(lambda d: text(d, "play-output"))  # the first words, before the end
    screenshot(browser, tmp_path, "playground-streaming")
    wait.until(lambda d: "completed" in text(d, "play-meta") or "incomplete" in text(d, "play-meta")
               or text(d, "play-error"))
    assert text(browser, "play-error") == ""
    assert text(browser, "play-output").strip()
    meta = text(browser, "play-meta")
    assert "task task_" in meta and "output" in meta and "tokens" in meta
    screenshot(browser, tmp_path, "playground")
    wait.until(lambda d: text(d, "plots"))  # the last hour's plots, or "no history"
    screenshot(browser, tmp_path, "history")


def test_a_models_read_token_sees_no_controls_and_the_api_refuses_them(console, browser, tmp_path):
    server, _ = console
    admin = server.pair(scopes="admin", name="operator-2")
    reader = server.pair(scopes="models:read", name="watcher")
    wait = log_in(browser, server, reader)
    wait.until(lambda d: "tiny" in text(d, "models"))
    assert text(browser, "scopes") == "scopes: models:read"
    for view in ("queue-view", "clients-view", "playground-view"):
        assert not browser.find_element(By.ID, view).is_displayed(), view
    assert not browser.find_elements(By.XPATH, "//button[text()='cancel' or text()='revoke' or text()='load']")
    screenshot(browser, tmp_path, "models-read")
    task = server.call("POST", "/v1/responses", {**LONG, "max_output_tokens": 4}, token=admin, expect=202)
    client_id = server.call("GET", "/v1/clients", token=admin)["data"][0]["id"]
    server.call("POST", f"/v1/tasks/{task['task']['id']}/cancel", token=reader, expect=403)
    server.call("DELETE", f"/v1/clients/{client_id}", token=reader, expect=403)
    server.call("PATCH", f"/v1/clients/{client_id}", {"max_queued": 0}, token=reader, expect=403)
    server.call("POST", "/v1/models/tiny/unload", token=reader, expect=403)
    server.call("POST", "/v1/pairings", {"scopes": ["admin"]}, token=reader, expect=403)
    assert server.call("GET", f"/v1/tasks/{task['task']['id']}", token=admin)["status"] != "cancelled"


def test_a_client_at_its_queue_limit_is_told_to_wait_in_the_playground(console, browser, tmp_path):
    server, _ = console
    admin = server.pair(scopes="admin", name="operator-3")
    limited = server.pair(scopes="responses:write,responses:read,models:read", name="limited")
    limited_id = next(c["id"] for c in server.call("GET", "/v1/clients", token=admin)["data"]
                      if c["name"] == "limited")
    server.call("PATCH", f"/v1/clients/{limited_id}", {"max_running": 0, "max_queued": 1}, token=admin)
    waiting = server.call("POST", "/v1/responses", {**LONG, "max_output_tokens": 4}, token=limited,
                          expect=202)["task"]["id"]
    wait = log_in(browser, server, limited)
    wait.until(lambda d: "tiny" in text(d, "models") and d.find_element(By.ID, "playground-view").is_displayed())
    browser.find_element(By.ID, "play-input").send_keys("Hello")
    browser.find_element(By.ID, "play-send").click()
    wait.until(lambda d: text(d, "play-error"))
    assert "rate_limited" in text(browser, "play-error")
    screenshot(browser, tmp_path, "playground-limited")
    # its waiting task on the page, then run and gone from the queue once the limits go
    wait.until(lambda d: (queue_row(d, waiting) or ["", ""])[1] == "queued")
    server.call("PATCH", f"/v1/clients/{limited_id}", {"max_running": None, "max_queued": None}, token=admin)
    wait.until(lambda d: queue_row(d, waiting) is None)
    server.wait_task(limited, waiting, lambda t: t["status"] == "completed", timeout=30)
