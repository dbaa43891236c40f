"""Headless Chromium for the console's tests: Debian's ``chromium`` driven through ``chromium-driver``.

Both come from Debian's packages (``scripts/bootstrap`` installs them); Selenium
is told where they are, so it downloads nothing. The browser is kept off the
network: every host name but loopback fails to resolve and background
services are off, so it only ever talks to the console under test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
#: Where to save a screenshot of each page the tests visit (docs/console/), when set.
SCREENSHOTS_ENV = "PIPELINE_CONSOLE_SCREENSHOTS"

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # root in a container has no user namespace for the sandbox
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1280,900",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--no-pings",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)


def _first(paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if Path(p).exists()), None)


def chromium(*, resolve: dict[str, str] | None = None) -> Iterator[object]:
    """A headless Chromium (Selenium WebDriver) until the generator is closed; ``resolve`` maps host
    names to addresses (as a DNS rebinding would), every other name but loopback fails to resolve."""
    binary, driver = _first(CHROMIUM), _first(DRIVER) or shutil.which("chromedriver")
    if binary is None or driver is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium and chromium-driver: scripts/bootstrap installs them (apt-get)")
        pytest.skip("no chromium and chromium-driver (scripts/bootstrap installs them with apt-get)")
    from selenium import webdriver  # noqa: PLC0415 (only these tests need it)
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    rules = "".join(f"MAP {name} {address}, " for name, address in (resolve or {}).items())
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag.replace("--host-resolver-rules=", "--host-resolver-rules=" + rules))
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    session.set_page_load_timeout(60)
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """A headless Chromium (Selenium WebDriver), shared by a module's tests."""
    yield from chromium()


def screenshot(driver: object, name: str) -> None:
    """Save the page as ``<name>.png`` in ``$PIPELINE_CONSOLE_SCREENSHOTS`` (nothing when unset)."""
    where = os.environ.get(SCREENSHOTS_ENV)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"{name}.png"))  # type: ignore[attr-defined]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_console(
    bootstrap: str,
    topology: Path,
    log: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> tuple[subprocess.Popen[bytes], str]:
    """``pipeline console`` as a real process on a free port; returns it and its base URL once it answers."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "console",
        "--bootstrap",
        bootstrap,
        "--topology",
        str(topology),
    ]
    argv += ["--host", host, "--port", str(port), "--refresh", "1", *extra]
    process = subprocess.Popen(
        argv,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the console exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                return process, base
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"the console did not answer within 30 s:\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> int:
    """Stop a console with SIGTERM; its exit status."""
    process.terminate()
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def wait_until(driver: Any, check: Callable[[Any], Any], timeout: float) -> Any:
    """Poll ``check`` until it returns a truthy value; an element the page replaced meanwhile (a page that
    refreshes itself, as a redrive run's does) is looked up again, not an error."""
    from selenium.common.exceptions import (  # noqa: PLC0415 (only these tests need it)
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    waiting = WebDriverWait(
        driver,
        timeout,
        poll_frequency=0.3,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    return waiting.until(check)
