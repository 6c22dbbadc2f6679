"""The operator's console in a real browser against a real ``lmsp serve`` serving SmolLM2
(and the demo model), with an hour of history written into its database before it starts:
each plot draws the hour; a background task is seen queued with its place, then running
with its tokens so far, then gone once finished; the clients view shows when each client
was last seen and its tokens today, as the API gives them; the playground streams SmolLM2's
answer and shows the usage and task the API has for it. Screenshots of each view go
under the test's tmp_path."""
from __future__ import annotations

import os
import re
import shutil
import time

import pytest
from console_helpers import chromium, log_in, queue_row, require_chromium, screenshot, table_row, text
from e2e_helpers import Server
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from lmsp.store import Store

SMOLLM2 = "smollm2-135m-instruct"
# SmolLM2 at temperature 0 writes numbers on to the limit: long enough to be seen running
NUMBERS = {"model": SMOLLM2, "input": "Write the numbers from 1 to 1000, separated by commas.",
           "background": True, "max_output_tokens": 400, "temperature": 0}
MINUTES = 60
#: the plots and the fields each draws (console.js's PLOTS)
PLOTS = {
    "tokens": ["tokens_per_second"],
    "queue": ["queued", "running"],
    "ttft": ["ttft_p50_ms", "ttft_p99_ms"],
    "errors": ["errors"],
    "disk": ["db_bytes", "kv_bytes", "model_bytes"],
}


def seed_history(db_path) -> None:
    """An hour of minutes, written by the store's own writer as a worker's janitor writes them."""
    store = Store.open(db_path)
    try:
        now = int(time.time() // 60)
        for i, minute in enumerate(range(now - MINUTES, now)):
            store.record_minute("earlier-worker", minute, {
                "tokens": 600 + 30 * (i % 7), "tasks_finished": 3, "errors": i % 5 == 0, "running": i % 3,
                "ttft": [[50.0, 2], [200.0, 1 + i % 4], [1000.0, i % 2], [None, 0]],
                "db_bytes": 1_000_000 + 4096 * i, "kv_bytes": 65536 * (i % 10)})
    finally:
        store.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory, demo_model_path, smollm2_path):
    require_chromium()
    root = tmp_path_factory.mktemp("console-live")
    models = root / "data" / "models"
    models.mkdir(parents=True)
    try:
        os.link(smollm2_path, models / f"{SMOLLM2}.gguf")
    except OSError:  # another file system
        shutil.copyfile(smollm2_path, models / f"{SMOLLM2}.gguf")
    seed_history(root / "data" / "lmsp.db")
    server = Server(root / "data", root, demo_model_path, {"LMSP_N_PARALLEL": "1"}).start(timeout=180)
    server.call("POST", "/v1/models", {"path": f"{SMOLLM2}.gguf"}, token=server.pair("models:write"), expect=201)
    yield server, root
    server.stop(timeout=10)


@pytest.fixture
def browser(console):
    with chromium(console[1] / "chromium") as driver:
        yield driver


def drawn(driver) -> dict[str, dict[str, int]]:
    """The points each plot's line of each field draws, as the page holds them."""
    return driver.execute_script(
        "const out = {};"
        "for (const f of document.querySelectorAll('#plots figure')) {"
        "  out[f.dataset.plot] = {};"
        "  for (const p of f.querySelectorAll('path')) out[f.dataset.plot][p.dataset.field] = +p.dataset.points;"
        "}"
        "return out;")


def running_with_tokens(cells: list[str] | None) -> bool:
    return cells is not None and cells[1] == "running" and cells[7].isdigit() and int(cells[7]) > 0


def test_each_plot_draws_the_last_hour(console, browser, tmp_path):
    server, _ = console
    wait = log_in(browser, server, server.pair(scopes="models:read", name="watcher"))
    wait.until(lambda d: len(drawn(d)) == len(PLOTS))
    plots = drawn(browser)
    history = server.call("GET", "/v1/service/history?minutes=60", token=server.pair("models:read"))["data"]
    assert len(history) >= MINUTES - 2  # the hour written before the start (its first minutes may be past it)
    for name, fields in PLOTS.items():
        for field in fields:  # every minute written draws a point of each line
            assert plots[name].get(field, 0) >= MINUTES - 2, (name, field, plots[name])
    captions = text(browser, "plots")
    assert "no points" not in captions and re.search(r"\d [KMG]iB", captions)  # the disk's bytes, as such
    screenshot(browser, tmp_path, "history")


def test_a_background_task_is_seen_queued_running_and_finished(console, browser, tmp_path):
    server, _ = console
    admin = server.pair(scopes="admin", name="operator")
    batch = server.pair(scopes="responses:write,responses:read", name="batch")
    batch_id = next(c["id"] for c in server.call("GET", "/v1/clients", token=admin)["data"] if c["name"] == "batch")
    server.call("PATCH", f"/v1/clients/{batch_id}", {"max_running": 0}, token=admin)  # held: its tasks wait
    first, second = (server.call("POST", "/v1/responses", NUMBERS, token=batch, expect=202)["task"]["id"]
                     for _ in "12")
    wait = log_in(browser, server, admin)
    wait.until(lambda d: (queue_row(d, second) or [""] * 2)[1] == "queued")
    one, two = queue_row(browser, first), queue_row(browser, second)
    assert one[:4] == [first, "queued", batch_id, SMOLLM2] and two[2:4] == [batch_id, SMOLLM2]
    assert (int(one[5]), int(one[6]), int(two[5]), int(two[6])) == (1, 0, 2, 1)  # place, the model's queue ahead
    assert one[7] == two[7] == "—"  # no tokens while queued
    screenshot(browser, tmp_path, "queue-waiting")

    server.call("PATCH", f"/v1/clients/{batch_id}", {"max_running": 1}, token=admin)  # one at a time
    wait.until(lambda d: running_with_tokens(queue_row(d, first)))
    running, waiting = queue_row(browser, first), queue_row(browser, second)
    assert running[5] == "—" and waiting[1] == "queued" and int(waiting[5]) == 1  # it moved up
    seen_tokens = int(running[7])
    screenshot(browser, tmp_path, "queue-running")

    server.call("POST", f"/v1/tasks/{second}/cancel", token=batch)
    done = server.wait_task(batch, first, lambda t: t["status"] == "completed", timeout=180)
    wait.until(lambda d: queue_row(d, first) is None and queue_row(d, second) is None)
    response = server.call("GET", f"/v1/responses/{done['response_id']}", token=batch)
    assert response["usage"]["output_tokens"] >= seen_tokens
    assert "output_tokens" not in done  # a finished task's count is its usage
    screenshot(browser, tmp_path, "queue-finished")


def test_the_clients_view_shows_last_seen_and_tokens_today(console, browser, tmp_path):
    server, _ = console
    admin = server.pair(scopes="admin", name="operator-2")
    user = server.pair(name="chat app")
    server.pair(name="idle")  # paired, never used
    server.call("POST", "/v1/responses", {**NUMBERS, "background": False, "max_output_tokens": 8}, token=user)
    wait = log_in(browser, server, admin)
    clients = {c["name"]: c for c in server.call("GET", "/v1/clients", token=admin)["data"]}
    chat = clients["chat app"]
    assert chat["last_seen_at"] is not None and chat["tokens_today"] > 0
    wait.until(lambda d: table_row(d, "clients", "client", chat["id"]))
    cells = table_row(browser, "clients", "client", chat["id"])
    # id, name, scopes, created, revoked, last seen, last task, tokens today, tokens 24 h
    assert cells[1] == "chat app" and cells[4] == "—"
    assert cells[5] != "—" and cells[6] != "—"
    assert (int(cells[7]), int(cells[8])) == (chat["tokens_today"], chat["tokens_24h"])
    assert clients["idle"]["last_seen_at"] is None
    assert table_row(browser, "clients", "client", clients["idle"]["id"])[5] == "—"
    assert browser.find_elements(By.XPATH, "//table[@id='clients']//button[text()='revoke']")
    screenshot(browser, tmp_path, "clients")


def test_the_playground_streams_smollm2s_answer_with_its_usage_and_task(console, browser, tmp_path):
    server, _ = console
    token = server.pair(scopes="responses:write,responses:read,models:read", name="playground")
    wait = log_in(browser, server, token)
    wait.until(lambda d: SMOLLM2 in [o.text for o in Select(d.find_element(By.ID, "play-model")).options])
    Select(browser.find_element(By.ID, "play-model")).select_by_visible_text(SMOLLM2)
    browser.find_element(By.ID, "play-max").clear()
    browser.find_element(By.ID, "play-max").send_keys("48")
    browser.find_element(By.ID, "play-input").send_keys("Tell me about the sea.")
    browser.find_element(By.ID, "play-send").click()
    wait.until(lambda d: text(d, "play-output"))  # the first words, before the end
    screenshot(browser, tmp_path, "playground-streaming")
    wait.until(lambda d: re.search(r"· (completed|incomplete) ·", text(d, "play-meta")) or text(d, "play-error"))
    assert text(browser, "play-error") == ""
    meta = text(browser, "play-meta")
    found = re.match(r"response (resp_\w+) · task (task_\w+) · \w+ · input (\d+) tokens, output (\d+) tokens", meta)
    assert found, meta
    response = server.call("GET", f"/v1/responses/{found[1]}", token=token)
    assert response["model"] == SMOLLM2 and response["task"]["id"] == found[2]
    assert (int(found[3]), int(found[4])) == (response["usage"]["input_tokens"], response["usage"]["output_tokens"])
    # what streamed is the stored answer (the page keeps the text as the deltas came)
    streamed = browser.execute_script("return document.getElementById('play-output').textContent")
    assert streamed == response["output"][0]["content"][0]["text"]
    screenshot(browser, tmp_path, "playground")
