"""The console at `/atmosphere/console/`, in a real browser (Playwright driving Debian's Chromium).

One stack for the module (all six services' real `serve()` on a real nats-server, a scripted
OpenAI-compatible provider, two users' token grants and an admin token, a denying policy). The
browser's DNS resolves nothing but the loopback address, and every request the page makes is
recorded: none may leave the stack's origin. A screenshot of each tab is saved under
`$ATMOSPHERE_ARTIFACTS` (default `.atmosphere/artifacts`), in `console/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, ConsoleMessage, Page, WebSocketRoute, async_playwright, expect

from atmosphere.bus import connect
from atmosphere.config import AuthOptions, TokenGrant
from atmosphere.dispatch.conversation import EXTRACTION_SYSTEM_PROMPT
from atmosphere.ingress.settings import IngressOptions
from atmosphere.testing import ModelRequest, ScriptedModel, Stack, ToolCallScript, Turn, run_stack, wait_until
from atmosphere.testing.pytest_plugin import delete_namespace_streams

from .conftest import ROOT, service_map

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

ADMIN = "console-admin-token-1"
ADA = "console-ada-token-01"
BOB = "console-bob-token-01"
GRANTS = (TokenGrant(token=ADA, user_id="ada", name="Ada"), TokenGrant(token=BOB, user_id="bob", name="Bob"))
POLICY = """\
version: "2026-12"
policies:
  - name: no-word-counts
    type: deny-list
    config:
      regex: ["^call_tool:word_count"]
  - name: shadow-no-notes
    type: deny-list
    dry-run: true
    config:
      regex: ["^call_tool:delete_note"]
"""
RELOADED = """\
version: "1.0"
name: console-policy
rules:
  - name: block-delete-everything
    condition: { field: tool_name, operator: eq, value: delete_everything }
    action: deny
    priority: 100
    message: "Deleting everything is not allowed"
defaults: { action: allow }
"""
ARTIFACTS = Path(os.environ.get("ATMOSPHERE_ARTIFACTS", ROOT / ".atmosphere" / "artifacts")) / "console"
CLOSED_NETWORK = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
"""Chromium's resolver answers no name but the loopback address: a CDN could not be reached."""
expect.set_options(timeout=20_000)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Debian's chromium is not installed: `make install` installs it (scripts/ensure_chromium.sh)"
    return found


class Model:
    """The scripted turns, in order; a conversation's fact extraction (at its close) is answered apart.

    The console closes a conversation's socket when another agent or conversation is picked, and
    the harness then extracts the user's facts with a model call, which must not eat the script.
    """

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.calls = 0
        """The scripted turns answered (fact extractions not counted)."""

    def script(self, *turns: Turn) -> None:
        self.turns.extend(turns)

    def __call__(self, request: ModelRequest) -> Turn:
        if request.messages and request.messages[0].get("content") == EXTRACTION_SYSTEM_PROMPT:
            return Turn.text("[]")
        if not self.turns:
            return Turn.error(f"no scripted turn left for request {self.calls + 1}")
        self.calls += 1
        return self.turns.pop(0)


@dataclass
class World:
    stack: Stack
    url: str
    provider: Model
    browser: Browser
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """The pages' script errors and console errors (a CSP violation is one): none is allowed."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def world(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    data = tmp_path_factory.mktemp("console")
    policies = data / "policies.yaml"
    policies.write_text(POLICY)
    namespace = f"t{uuid.uuid4().hex[:12]}"
    model = Model()
    provider = ScriptedModel(function=model)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with provider.serving(), connect(nats_url, name="console", namespace=namespace) as bus:
        services = service_map(
            nats_url,
            namespace,
            data / "data",
            app="tests.e2e.apps.console_app:app",
            llm_base_url=provider.base_url,
            ingress={"ingress": IngressOptions(port=0, auth_tokens=GRANTS), "admin_token": ADMIN},
            dispatch={"ingress": AuthOptions(auth_tokens=GRANTS)},
            governance={"governance": {"policy_files": [policies]}},
        )
        try:
            async with run_stack(services, bus=bus) as stack, async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=chromium(),
                    args=[f"--host-resolver-rules={CLOSED_NETWORK}", "--disable-dev-shm-usage"],
                )
                try:
                    yield World(stack, await stack.ingress_url(), model, browser)
                finally:
                    await browser.close()
        finally:
            await delete_namespace_streams(bus, namespace)


@pytest.fixture(autouse=True)
def fresh_script(world: World) -> Iterator[None]:
    world.provider.turns.clear()
    world.errors.clear()
    world.requests.clear()
    yield
    assert not world.provider.turns, "the test left scripted replies unused"
    assert world.errors == [], "the page had script or console errors"
    assert outside_the_stack(world) == []


async def signed_in(world: World, token: str, *, admin: str = "", width: int = 1280) -> Page:
    """A fresh browser context (its own session storage), signed in; every request it makes recorded."""
    context = await world.browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = await context.new_page()
    page.on("request", lambda request: world.requests.append(request.url))
    page.on("websocket", lambda socket: world.requests.append(socket.url))
    page.on("pageerror", lambda error: world.errors.append(f"{error}"))
    page.on("console", lambda message: world.errors.append(message.text) if is_error(message) else None)
    await page.goto(f"{world.url}/atmosphere/console/")
    await page.locator("#login-token").fill(token)
    if admin:
        await page.locator("#login-admin").fill(admin)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("tab", name="Chat")).to_have_attribute("aria-selected", "true")
    return page


def is_error(message: ConsoleMessage) -> bool:
    """A console error, but not Chromium's line for an HTTP error answer (a 404 the page expects and shows)."""
    return message.type == "error" and not message.text.startswith("Failed to load resource: the server responded")


async def tab(page: Page, name: str) -> None:
    await page.get_by_role("tab", name=name).click()
    await expect(page.get_by_role("tab", name=name)).to_have_attribute("aria-selected", "true")


async def chat(page: Page, agent: str, prompt: str) -> None:
    await page.locator("#chat-agent").select_option(agent)
    await page.locator("#chat-input").fill(prompt)
    await page.keyboard.press("Enter")


def last_turn(page: Page) -> Any:
    return page.locator("#chat-log .turn").last


def state_of(turn: Any) -> Any:
    """The badge of the turn's own run (not a sub-agent's nested in it)."""
    return turn.locator(".msg.agent > .run-meta > .badge")


def answer_of(turn: Any) -> Any:
    """The turn's own answer text (a sub-agent's is nested in its task card)."""
    return turn.locator(".msg.agent > .answer")


async def shot(page: Page, name: str) -> None:
    await page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


class TestTheConsole:
    async def test_chat_approval_workspace_tape_and_governance(self, world: World) -> None:
        page = await signed_in(world, ADA, admin=ADMIN)
        assert await page.get_by_role("tab").all_inner_texts() == ["Chat", "Workspace", "Tape", "Governance", "Runtime"]

        # Chat: a tool that needs approval; the person approves; the tool card and the answer show.
        world.provider.script(
            Turn.tool_calls(ToolCallScript("delete_note", {"title": "groceries"}, call_id="call_del")),
            Turn.text("Deleted the note groceries."),
        )
        await chat(page, "notes", "Delete the note groceries")
        turn = last_turn(page)
        card = turn.locator('details[data-tool="delete_note"]')
        await expect(card).to_contain_text('"title": "groceries"')
        approval = card.get_by_role("group", name="Approval for delete_note")
        await approval.get_by_role("button", name="Approve").click()
        await expect(approval).to_contain_text("Approved.")
        await expect(card).to_contain_text("deleted note 'groceries'")
        await expect(card.locator(".badge")).to_have_text(re.compile(r"^ok · \d+ ms$"))
        await expect(answer_of(turn)).to_have_text("Deleted the note groceries.")
        await expect(state_of(turn)).to_have_text("done")
        await expect(turn).to_contain_text("tokens in")
        notes_run = (await turn.locator(".run-meta .mono").get_attribute("title")) or ""
        assert notes_run
        await shot(page, "chat")

        # A plan and a file: the chat's live plan, then the Workspace tab's stored plan and files.
        plan = [
            {"content": "Write the haiku", "status": "in_progress", "activeForm": "Writing the haiku"},
            {"content": "Save it", "status": "pending"},
        ]
        world.provider.script(
            Turn.tool_calls(ToolCallScript("write_todos", {"todos": plan, "goal": "A haiku on disk"})),
            Turn.tool_calls(
                ToolCallScript("write_file", {"path": "poems/haiku.md", "content": "old pond\nfrog jumps"})
            ),
            Turn.tool_calls(ToolCallScript("write_todos", {"todos": [dict(s, status="completed") for s in plan]})),
            Turn.text("Saved poems/haiku.md."),
        )
        await page.get_by_role("button", name="New conversation").click()
        await chat(page, "coder", "Plan a short task and save the result to a file")
        await expect(state_of(last_turn(page))).to_have_text("done")
        await expect(page.locator("#chat-plan li")).to_have_count(2)
        await expect(page.locator("#chat-plan li.completed")).to_have_count(2)
        await tab(page, "Workspace")
        await expect(page.locator("#ws-agent")).to_have_value("coder")
        stored = page.locator("#ws-plan li")
        await expect(stored).to_have_text(["✓ Write the haiku (completed)", "✓ Save it (completed)"])
        await expect(page.locator("#ws-live-plan li.completed")).to_have_count(2)  # the last plan-update
        await page.get_by_role("button", name="Folder poems").click()
        await page.get_by_role("button", name="File haiku.md").click()
        await expect(page.locator("#ws-file")).to_have_text("old pond\nfrog jumps")
        await shot(page, "workspace")

        # A denied tool call: the Governance tab's log shows the decision.
        world.provider.script(
            Turn.tool_calls(ToolCallScript("word_count", {"text": "one two"}, call_id="call_wc")),
            Turn.text("Counting words is not allowed here."),
        )
        await tab(page, "Chat")
        await chat(page, "coder", "Count the words of 'one two'")
        await expect(state_of(last_turn(page))).to_have_text("done")
        await expect(answer_of(last_turn(page))).to_have_text("Counting words is not allowed here.")
        # Stopped before it started: no tool card (the seed's wire sends no tool-start for it).
        assert await last_turn(page).locator('details[data-tool="word_count"]').count() == 0
        await tab(page, "Governance")
        await expect(page.locator("#gov-policies tbody")).to_contain_text("no-word-counts")
        await page.locator("#gov-dec-decision").select_option("deny")
        await page.get_by_role("button", name="Filter").click()
        await expect(page.locator("#gov-decisions tbody tr").first).to_contain_text("no-word-counts")
        await expect(page.locator("#gov-decisions tbody tr").first).to_contain_text("word_count")

        # The kill switch: armed with a reason (a run is then refused), disarmed again.
        await page.locator("#gov-kill-reason").fill("console drill")
        await page.get_by_role("button", name="Arm", exact=True).click()
        await expect(page.locator("#gov-kill-state")).to_contain_text("ARMED by console: console drill")
        await shot(page, "governance")
        async with httpx.AsyncClient(base_url=world.url) as http:
            health = (await http.get("/api/admin/governance/health", headers=bearer(ADMIN))).json()
            assert health["killSwitch"]["armed"] is True
        await page.get_by_role("button", name="Disarm").click()
        await expect(page.locator("#gov-kill-state")).to_contain_text("Disarmed")
        # The dry-run policy saw the approved delete_note and would have denied it.
        await expect(page.locator("#gov-policies tr", has_text="shadow-no-notes")).to_contain_text(
            re.compile(r"Denies: [1-9]")
        )
        # A policy document reloaded in place of another, then asked through /check.
        await page.get_by_text("Reload a policy document").click()
        await page.locator("#gov-reload-name").fill("no-word-counts")
        await page.locator("#gov-reload-yaml").fill(RELOADED)
        await page.get_by_role("button", name="Reload").click()
        await expect(page.locator("#gov-reload-result")).to_contain_text('"reloaded": "no-word-counts"')
        await expect(page.locator("#gov-policies tbody")).to_contain_text("console-policy")
        await page.locator("#gov-check-agent").fill("notes")
        await page.locator("#gov-check-action").fill("call_tool")
        await page.locator("#gov-check-context").fill('{"tool_name": "delete_everything"}')
        await page.get_by_role("button", name="Check").click()
        await expect(page.locator("#gov-check-result")).to_contain_text('"allowed": false')
        await expect(page.locator("#gov-check-result")).to_contain_text("Deleting everything is not allowed")

        # The Tape: the approval run is listed, its steps and coordination open, it replays without a model.
        await tab(page, "Tape")
        await page.locator("#tape-agent").select_option("notes")
        await page.get_by_role("button", name="Search").click()
        row = page.locator(f'#tape-runs tr[data-run="{notes_run}"]')
        await expect(row).to_contain_text("COMPLETED")
        await expect(row).to_contain_text("ada")
        calls_before = world.provider.calls
        await row.get_by_role("button").click()
        await expect(page.locator("#tape-steps li").first).to_be_visible()
        await expect(page.locator("#tape-steps")).to_contain_text("approval")
        await page.get_by_role("button", name="Replay").click()
        await expect(page.locator("#tape-replay-body .replayed-output")).to_have_text("Deleted the note groceries.")
        await expect(page.locator("#tape-replay-body")).to_contain_text("delete_note")
        async with page.expect_download() as download_info:
            await page.get_by_role("button", name="Export").click()
        download = await download_info.value
        assert download.suggested_filename == f"run-{notes_run}.json"
        assert world.provider.calls == calls_before  # replaying called no model
        await shot(page, "tape")

        await tab(page, "Runtime")
        await expect(page.locator("#info-body")).to_contain_text("Harness primitives")
        await expect(page.locator("#info-body")).to_contain_text("governance")
        await shot(page, "runtime")
        await page.context.close()
        assert_only_the_stack(world)

    async def test_a_second_user_sees_none_of_the_first_users_runs(self, world: World) -> None:
        ada_runs = await runs_of(world, ADA)
        assert ada_runs, "the first test's runs are Ada's"
        page = await signed_in(world, BOB)
        # No admin tabs for a user, and the Tape shows only Bob's own runs: none yet.
        assert await page.get_by_role("tab").all_inner_texts() == ["Chat", "Tape", "Runtime"]
        await tab(page, "Tape")
        await expect(page.locator("#tape-runs tbody")).to_contain_text("No recorded runs match.")
        # Bob's own run shows up; Ada's never do, even asked for by id.
        world.provider.script(Turn.text("Hello Bob."))
        await tab(page, "Chat")
        await chat(page, "notes", "Hello")
        await expect(answer_of(last_turn(page))).to_have_text("Hello Bob.")
        bob_run = (await last_turn(page).locator(".run-meta .mono").get_attribute("title")) or ""

        async def listed() -> bool:
            await tab(page, "Tape")
            return await page.locator(f'#tape-runs tr[data-run="{bob_run}"]').count() == 1

        await wait_until(listed, timeout=15, interval=0.3, what="Bob's run on the tape")
        shown = await page.locator("#tape-runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")
        assert shown == [bob_run]
        status = await page.evaluate(
            """async ([id, token]) =>
                (await fetch(`/api/runs/${id}/steps`, {headers: {Authorization: `Bearer ${token}`}})).status""",
            [ada_runs[0], BOB],
        )
        assert status == 404
        await shot(page, "second-user-tape")
        await page.context.close()
        assert_only_the_stack(world)

    async def test_a_sub_agent_nests_under_its_task_and_in_the_coordination_tree(self, world: World) -> None:
        page = await signed_in(world, ADA, admin=ADMIN)
        world.provider.script(
            Turn.tool_calls(ToolCallScript("task", {"description": "Brainstorm three team-building activities"})),
            Turn.tool_calls(
                ToolCallScript("write_todos", {"todos": [{"content": "List ideas", "status": "in_progress"}]})
            ),
            Turn.text("Report: escape room, cooking class, hackathon."),
            Turn.text("Here are three ideas from my helper."),
        )
        await chat(page, "concierge", "Use the task tool to brainstorm team-building activities")
        turn = last_turn(page)
        await expect(state_of(turn)).to_have_text("done")
        await expect(answer_of(turn)).to_have_text("Here are three ideas from my helper.")
        task = turn.locator('.msg.agent > details[data-tool="task"]')
        sub = task.locator(".sub")
        await expect(sub.locator(".run-meta")).to_contain_text("sub-agent _subagent")
        await expect(sub.locator('details[data-tool="write_todos"]')).to_contain_text("List ideas")
        await expect(sub.locator(".answer")).to_have_text("Report: escape room, cooking class, hackathon.")
        await expect(sub.locator(".plan li")).to_have_count(1)  # its own plan, not the conversation's
        await expect(page.locator("#chat-plan")).to_contain_text("No plan yet")
        await expect(task.locator(":scope > pre").last).to_contain_text("Report: escape room")
        parent = (await turn.locator(".msg.agent > .run-meta > .mono").get_attribute("title")) or ""
        # The Tape: the coordinator's run, its sub-run one click away in the tree.
        await tab(page, "Tape")
        await page.locator("#tape-agent").select_option("concierge")

        async def listed() -> bool:
            await page.get_by_role("button", name="Search").click()
            return await page.locator(f'#tape-runs tr[data-run="{parent}"]').count() == 1

        await wait_until(listed, timeout=15, interval=0.3, what="the coordinator's run on the tape")
        await page.locator(f'#tape-runs tr[data-run="{parent}"]').get_by_role("button").click()
        children = page.locator("#tape-tree li li button")
        await expect(children).to_have_count(1)
        await children.click()
        await expect(page.locator("#tape-run-title")).to_contain_text("_subagent")
        await expect(page.locator("#tape-tree")).to_contain_text(f"parent {parent[:8]}")
        await shot(page, "tape-coordination")
        await page.context.close()

    async def test_a_dropped_connection_resumes_the_answer(self, world: World) -> None:
        page = await signed_in(world, ADA)
        opened: list[str] = []
        # Long enough for the answer check (a deny-list judges answers) to release it in several
        # pieces, each a frame: it releases what each check covered (every 200 characters) at once.
        answer = " ".join(f"word{i}" for i in range(160))
        world.provider.script(Turn.text(answer, chunk_delay=0.02))
        tasks: list[asyncio.Task[None]] = []

        async def network(socket: WebSocketRoute) -> None:
            """The first connection drops after three pieces of text; the page's resume goes through."""
            opened.append(socket.url)
            server = socket.connect_to_server()
            if len(opened) > 1:
                return
            pieces = 0

            async def drop() -> None:
                # Not a clean close (1000/1001 would cancel the run): the network was lost.
                with contextlib.suppress(Exception):
                    await server.close(code=4000, reason="network lost")
                with contextlib.suppress(Exception):
                    await socket.close(code=4000, reason="network lost")

            def from_server(message: str | bytes) -> None:
                nonlocal pieces
                if pieces >= 3:
                    return  # lost with the connection
                socket.send(message)
                if '"streaming-text"' in str(message):
                    pieces += 1
                    if pieces == 3:
                        tasks.append(asyncio.get_running_loop().create_task(drop()))

            server.on_message(from_server)

        await page.route_web_socket(re.compile(r".*/atmosphere/agent/.*"), network)
        await chat(page, "notes", "Count to eight")
        turn = last_turn(page)
        await expect(state_of(turn)).to_have_text("done")
        await expect(answer_of(turn)).to_have_text(answer)  # every word once, in order
        await expect(turn.locator(".run-meta")).to_contain_text("resumed from seq")
        assert len(opened) == 2
        assert "runId=" in opened[1]
        assert "lastSeq=" in opened[1]
        await asyncio.gather(*tasks)
        await page.context.close()

    async def test_artifacts_show_inline_and_download(self, world: World) -> None:
        page = await signed_in(world, ADA)
        await chat(page, "artist", "Draw it")
        turn = last_turn(page)
        await expect(state_of(turn)).to_have_text("done")
        image = turn.get_by_role("img", name="Image from the run")
        await expect(image).to_be_visible()
        assert await image.evaluate("img => img.complete && img.naturalWidth") == 40  # decoded, not a broken icon
        async with page.expect_download() as download_info:
            await turn.get_by_role("link", name="Download data.csv (8 bytes)").click()
        download = await download_info.value
        assert download.suggested_filename == "data.csv"
        assert Path(await download.path()).read_bytes() == b"x,y\n1,2\n"
        await expect(answer_of(turn)).to_have_text("Here is the plot and its data.")
        await shot(page, "chat-artifacts")
        await page.context.close()

    async def test_model_text_is_never_markup(self, world: World) -> None:
        page = await signed_in(world, ADA)
        hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
        world.provider.script(Turn.text(hostile))
        await chat(page, "notes", hostile)
        await expect(answer_of(last_turn(page))).to_have_text(hostile)
        assert await page.evaluate("window.pwned === undefined")
        assert await page.locator("#chat-log img").count() == 0
        await page.context.close()

    async def test_keyboard_labels_and_a_narrow_screen(self, world: World) -> None:
        page = await signed_in(world, ADA, admin=ADMIN, width=390)
        # Every control has a label a screen reader can read.
        unlabelled = await page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea')]
                .filter(e => !e.labels?.length && !e.getAttribute('aria-label')).map(e => e.id)"""
        )
        assert unlabelled == []
        # The tabs are a keyboard tablist: arrows move and select.
        await page.get_by_role("tab", name="Chat").focus()
        await page.keyboard.press("ArrowRight")
        await expect(page.get_by_role("tab", name="Workspace")).to_have_attribute("aria-selected", "true")
        await page.keyboard.press("End")
        await expect(page.get_by_role("tab", name="Runtime")).to_have_attribute("aria-selected", "true")
        await page.keyboard.press("Home")
        await expect(page.get_by_role("tab", name="Chat")).to_have_attribute("aria-selected", "true")
        # Nothing wider than the screen.
        assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        await shot(page, "narrow-chat")
        await page.context.close()

    async def test_the_page_is_served_whole_and_locked_down(self, world: World) -> None:
        async with httpx.AsyncClient(base_url=world.url) as http:
            page = await http.get("/atmosphere/console/")
            assert page.status_code == 200
            policy = page.headers["content-security-policy"]
            assert "default-src 'none'" in policy
            assert "script-src 'self'" in policy
            assert "frame-ancestors 'none'" in policy
            assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # nothing from elsewhere
            redirect = await http.get("/atmosphere/console")
            assert (redirect.status_code, redirect.headers["location"]) == (308, "/atmosphere/console/")
            assets = (("console.js", "text/javascript"), ("console.css", "text/css"), ("favicon.svg", "image/svg+xml"))
            for name, kind in assets:
                asset = await http.get(f"/atmosphere/console/{name}")
                assert asset.status_code == 200
                assert asset.headers["content-type"].startswith(kind)
            for name in ("../api.py", "%2e%2e%2fapi.py", "index.html.bak", "console_page"):
                assert (await http.get(f"/atmosphere/console/{name}")).status_code == 404, name


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def runs_of(world: World, token: str) -> list[str]:
    async with httpx.AsyncClient(base_url=world.url, headers=bearer(token)) as http:
        return [run["runId"] for run in (await http.get("/api/runs")).json()]


def outside_the_stack(world: World) -> list[str]:
    """The requests the pages made anywhere but the stack's own origin (a CDN, a font, a beacon)."""
    origin = world.url.split("://", 1)[1]
    return [
        url
        for url in world.requests
        if not url.startswith("blob:") and url.split("://", 1)[1].split("/", 1)[0] != origin
    ]


def assert_only_the_stack(world: World) -> None:
    """Every request the page made went to the stack's own origin, the agent's WebSocket included."""
    assert outside_the_stack(world) == []
    assert any(url.startswith("ws://") for url in world.requests)
