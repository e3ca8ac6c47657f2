"""Headless Chromium for browser tests: Debian's `chromium` package driven by Playwright
(the Python package only; it never downloads a browser). Reusable: launch, log into a
tenant admin, take screenshots into an artifacts folder.

Install the browser with `apt-get install -y chromium` (`make test` does it when absent).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("TALLY_CHROMIUM", "/usr/bin/chromium")
LAUNCH_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "var" / "artifacts"


def chromium_required() -> str:
    """The Chromium binary, or fail saying how to install it."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}. Install Debian's package: `sudo apt-get install -y chromium` "
            "(`make test` installs it when missing), or set TALLY_CHROMIUM to the binary.", pytrace=False,
        )
    return CHROMIUM


@contextmanager
def browser_page(*, host_map: dict[str, str] | None = None) -> Iterator[Any]:
    """A fresh headless Chromium page. `host_map` maps host names to addresses (tenant hosts
    like demo.localhost -> 127.0.0.1) inside the browser, with no DNS or /etc/hosts."""
    executable = chromium_required()
    from playwright.sync_api import sync_playwright

    flags = list(LAUNCH_FLAGS)
    if host_map:
        flags.append("--host-resolver-rules=" + ",".join(f"MAP {host} {address}" for host, address in host_map.items()))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=flags, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def artifacts_dir(name: str) -> Path:
    """var/artifacts/<name>/, emptied; printed so a CI log says where the screenshots are."""
    folder = ARTIFACTS / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"browser artifacts: {folder}")
    return folder


def screenshot(page: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def admin_login(page: Any, *, base_url: str, username: str, password: str) -> None:
    """Log into an admin site (tenant or platform) through its login form."""
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


def stylesheet_loaded(page: Any, href_part: str) -> bool:
    """True when a stylesheet whose URL contains `href_part` loaded and has rules."""
    return bool(page.evaluate(
        """(part) => Array.from(document.styleSheets).some(s => {
            if (!s.href || !s.href.includes(part)) return false;
            try { return s.cssRules.length > 0; } catch (e) { return false; }
        })""",
        href_part,
    ))
