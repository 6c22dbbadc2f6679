"""The browser side of the console's tests: Debian's Chromium driven by selenium with
Debian's chromedriver (nothing downloaded), logging in with a token, reading the page's
tables as they are redrawn, and screenshots that are checked to be written."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from e2e_helpers import Server
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PNG = b"\x89PNG\r\n\x1a\n"


def require_chromium() -> None:
    # a test tool like nginx or strace: missing, it fails (the console's proof never goes unchecked)
    assert CHROMIUM and DRIVER, ("Debian's chromium and chromium-driver packages are not installed "
                                 "(apt-get install chromium chromium-driver; scripts/dev test installs them)")


@contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with its profile in ``profile``."""
    require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def log_in(driver, server: Server, token: str) -> WebDriverWait:
    driver.get(server.base_url + "/console")
    wait = WebDriverWait(driver, 60, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait.until(lambda d: d.find_element(By.ID, "views").is_displayed())
    return wait


def table_row(driver, table: str, key: str, value: str) -> list[str] | None:
    """The cells of the row of ``table`` whose ``data-KEY`` is ``value``, read at once (the
    tables are redrawn as the page polls); None while there is none."""
    return driver.execute_script(
        "const row = document.querySelector(`#${arguments[0]} tr[data-${arguments[1]}='${arguments[2]}']`);"
        "return row ? [...row.cells].map((cell) => cell.textContent) : null;", table, key, value)


def queue_row(driver, task_id: str) -> list[str] | None:
    """A task's row in the queue: task, status, client, model, age, position, ahead, tokens so far."""
    return table_row(driver, "queue", "task", task_id)


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def screenshot(driver, folder: Path, name: str) -> Path:
    """The page as it is now, in ``folder/NAME.png``, checked to be a written PNG."""
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 1000, path
    return path
