"""Browser tests: Debian's headless Chromium driven by Playwright against a live Django server.

Playwright's own browser download does not work here (and is never used): the
tests launch ``/usr/bin/chromium`` (``.ci/browser-setup`` installs it) with a
fresh user-data folder per test. Screenshots of every page go to
``artifacts/screenshots/`` (the README names it; CI keeps it as an artifact).

Playwright's sync API runs an asyncio loop in this thread, and Django refuses
ORM calls from a thread with a running loop unless told the caller knows what
it does: the tests' own setup calls are plain synchronous code, so
``DJANGO_ALLOW_ASYNC_UNSAFE`` is set for this folder only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import BrowserContext, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run .ci/browser-setup (apt-get install chromium)")
    with sync_playwright() as p:
        yield p.chromium


class Browsers:
    """Opens one browser (its own user-data folder) per person in a test; closes them all at the end."""

    def __init__(self, chromium: object, tmp: Path, base_url: str) -> None:
        self.chromium, self.tmp, self.base_url = chromium, tmp, base_url
        self.contexts: list[BrowserContext] = []

    def open(self, name: str, *, width: int = 1920, height: int = 1080) -> Page:
        folder = self.tmp / f"profile-{name}"
        folder.mkdir()
        context = self.chromium.launch_persistent_context(  # type: ignore[attr-defined]
            str(folder),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            base_url=self.base_url,
            viewport={"width": width, "height": height},
        )
        context.set_default_timeout(15_000)
        self.contexts.append(context)
        page = context.pages[0] if context.pages else context.new_page()
        page.on("dialog", lambda d: d.accept())  # the rotate-token confirm
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def browsers(chromium: object, live_server: object, tmp_path: Path) -> Iterator[Browsers]:
    b = Browsers(chromium, tmp_path, str(live_server.url))  # type: ignore[attr-defined]
    yield b
    b.close()


def login(page: Page, username: str, password: str) -> None:
    page.goto("/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


def shot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
