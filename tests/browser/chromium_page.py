"""A page in Debian's headless Chromium (via Playwright) for the browser tests, with the page's
JavaScript errors collected."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


@contextmanager
def chromium_page(profile: Path, width: int = 1400, height: int = 1000) -> Iterator[tuple[Any, list[str]]]:
    """(page, errors): a new page (viewport `width` x `height`) in a fresh Chromium profile under
    `profile`; `errors` fills with the page's uncaught JavaScript errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=ARGS,
            headless=True,
            viewport={"width": width, "height": height},
        )
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, errors
        finally:
            context.close()
