"""The console with no network but loopback: run inside `unshare --net` by `test_console_offline.py`.

It starts `atmosphere dev` (no model), opens the console in Chromium, signs in with the banner's
admin token, chats with `echo` and reads the Runtime tab; every request the page makes must stay
on the stack's origin, and none may fail. Exits 0 when all of it held (an assertion fails otherwise).

    python -m tests.e2e.console_offline <chromium> <screenshot dir>
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import signal
import socket
import struct
import sys
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright, expect

from .dev_process import port_args, port_of, started, wait_for_banner

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "hello from a closed network"
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40


def loopback_up() -> None:
    """Bring `lo` up in this (new) network namespace, where it starts down: no `ip` command needed."""
    flags = struct.pack("16sH14s", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING, bytes(14))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        fcntl.ioctl(control, SIOCSIFFLAGS, flags)


async def main(chromium: str, shots: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="console-offline-"))
    ports = port_args()
    argv = [str(Path(sys.executable).parent / "atmosphere"), "dev", "--home", str(home / "home"), *ports, "--no-model"]
    log = home / "dev.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "ATMOSPHERE_ADMIN"))}
    with started(argv, cwd=ROOT, env=env, log=log) as process:
        await wait_for_banner(process, log)
        token = re.search(r"Authorization: Bearer (\S+)\)", log.read_text())
        assert token, log.read_text()
        url = f"http://127.0.0.1:{port_of(ports, '--http-port')}"
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium, args=["--disable-dev-shm-usage"])
            page = await browser.new_page()
            seen: list[str] = []
            failed: list[str] = []
            page.on("request", lambda request: seen.append(request.url))
            page.on("websocket", lambda socket: seen.append(socket.url))
            page.on("requestfailed", lambda request: failed.append(request.url))
            await page.goto(f"{url}/atmosphere/console/")
            await page.locator("#login-admin").fill(token[1])
            await page.get_by_role("button", name="Sign in").click()
            chat = page.get_by_role("tab", name="Chat")
            await expect(chat).to_have_attribute("aria-selected", "true", timeout=20_000)
            await page.locator("#chat-agent").select_option("echo")
            await page.locator("#chat-input").fill(PROMPT)
            await page.keyboard.press("Enter")
            turn = page.locator("#chat-log .turn").last
            await expect(turn.locator(".msg.agent > .answer")).to_have_text(PROMPT, timeout=20_000)
            await page.get_by_role("tab", name="Runtime").click()
            await expect(page.locator("#info-body")).to_contain_text("tape", timeout=20_000)
            await page.screenshot(path=shots / "offline-runtime.png", full_page=True)
            await browser.close()
        origin = url.split("://", 1)[1]
        outside = [u for u in seen if u.split("://", 1)[1].split("/", 1)[0] != origin]
        assert outside == [], outside
        assert failed == [], failed
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0, log.read_text()
    print("the console worked with the network closed:", len(seen), "requests, all to", origin)


if __name__ == "__main__":
    loopback_up()
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
