"""The web console in a real browser: Debian's headless Chromium driven by Playwright, against the
real memgate (nats-server, every actor, DuckDB, Tantivy, the ONNX model) and its REST adapter.

Each story is done in the page as a person would (labels, buttons, the keyboard) and checked
through the API afterwards. Screenshots go to `MEMGATE_SCREENSHOTS` (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import socket
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.agents import RestAgent
from tests.conftest import ADMIN_TOKEN, Member, Memgate

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As the machine notes say: without the background-networking flags Chromium keeps trying
# hosts this closed network refuses.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"
                       " (.ci/run installs it)"),
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                    args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("MEMGATE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# what the browser reported as errors (console errors, uncaught exceptions), by page
FAILURES: dict[Page, list[str]] = {}


async def signed_in(browser: Browser, memgate: Memgate, token: str) -> Page:
    """A fresh browser context (no storage), the console opened, signed in from the keyboard."""
    context = await browser.new_context(base_url=str(memgate.http.base_url))
    page = await context.new_page()
    failures = FAILURES.setdefault(page, [])
    page.on("console", lambda m: failures.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: failures.append(str(e)))
    response = await page.goto("/console")
    assert response is not None and response.status == 200
    await page.get_by_label("Member token or operator token").fill(token)
    await page.keyboard.press("Enter")
    await expect(page.locator("#who")).to_contain_text("Signed in")
    return page


async def agent_memories(memgate: Memgate, member: Member) -> list[dict[str, str]]:
    listed = await memgate.ok("GET", f"/api/w/{member.workspace_id}/ask-history/agent-memories"
                              "?limit=100", member.token)
    return list(listed["memories"])


async def test_a_member_deletes_a_memory_in_the_console_and_the_api_no_longer_lists_it(
        memgate: Memgate, browser: Browser, tmp_path: Path) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner)
    agent = RestAgent(memgate.http, await memgate.credential(member))
    texts = ["prefers window seats on long flights", "is allergic to peanuts",
             "<img src=x onerror=alert(1)> likes tea"]
    ids = [(await agent.remember("travel", text)).memory_id for text in texts]

    page = await signed_in(browser, memgate, member.token)
    rows = page.locator("#memories-table tbody tr")
    await expect(rows).to_have_count(3)
    # memory text is untrusted: shown as text, never as markup
    await expect(page.locator("#memories-table img")).to_have_count(0)
    await expect(page.get_by_role("cell", name=texts[2])).to_be_visible()

    await page.get_by_label("Search my memories").fill("peanut")
    await expect(rows).to_have_count(1)
    await page.screenshot(path=shots(tmp_path) / "console-member.png", full_page=True)
    # from the keyboard: the checkbox, then the delete button
    await page.get_by_label("Select memory 1").focus()
    await page.keyboard.press("Space")
    await page.get_by_role("button", name="Delete selected").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator("#memories-status")).to_have_text("Deleted 1 memory.")

    listed = [m["memoryId"] for m in await agent_memories(memgate, member)]
    assert sorted(listed) == sorted([ids[0], ids[2]])

    await page.get_by_label("Search my memories").fill("")
    await page.get_by_role("button", name="Delete all").click()
    await page.get_by_role("button", name="Yes, delete every memory agents keep about me").click()
    await expect(page.locator("#memories-status")).to_have_text("Deleted 2 memories.")
    assert await agent_memories(memgate, member) == []
    await expect(rows).to_have_count(0)
    assert FAILURES[page] == []


async def test_an_owner_creates_a_credential_and_sees_its_token_once(
        memgate: Memgate, browser: Browser, tmp_path: Path) -> None:
    owner = await memgate.workspace()
    page = await signed_in(browser, memgate, owner.token)
    await page.get_by_role("button", name="Workspace").click()
    await page.get_by_label("New credential's name").fill("travel agent")
    await page.get_by_role("button", name="Create credential").click()
    secret = page.locator("#secret-value")
    await expect(secret).to_have_text(re.compile(r"^mga"))
    token = (await secret.text_content() or "").strip()
    await expect(page.get_by_role("cell", name="travel agent", exact=True)).to_be_visible()
    await page.screenshot(path=shots(tmp_path) / "console-owner.png", full_page=True)

    # the token shown works for an agent
    remembered = await RestAgent(memgate.http, token).remember("travel", "likes aisle seats")
    assert remembered.memory_id

    await page.get_by_role("button", name="I have copied it: hide it").click()
    assert token not in await page.content()
    await page.reload()  # signed in again from this tab's storage: the list never has it
    await page.get_by_role("button", name="Workspace").click()
    await expect(page.get_by_role("cell", name="travel agent", exact=True)).to_be_visible()
    assert token not in await page.content()
    # the member token is in no cookie and no address
    assert await page.context.cookies() == []
    assert owner.token not in page.url

    await page.get_by_role("button", name="Revoke credential travel agent").click()
    await expect(page.get_by_role("cell", name="travel agent", exact=True)).to_have_count(0)
    refused = await memgate.http.post("/api/agent/v1/memories/list", json={},
                                      headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 401
    assert FAILURES[page] == []


async def test_an_operator_runs_an_erasure_to_completed(
        memgate: Memgate, browser: Browser, tmp_path: Path) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner)
    agent = RestAgent(memgate.http, await memgate.credential(member))
    for text in ("lives near the harbour", "drives a blue van"):
        await agent.remember("profile", text)

    page = await signed_in(browser, memgate, ADMIN_TOKEN)
    await page.get_by_label("Workspace id").fill(owner.workspace_id)
    await page.get_by_label("Subject is").select_option("memberId")
    await page.get_by_label("Subject id").fill(member.member_id)
    await page.get_by_role("button", name="Receive request").click()
    progress = page.locator("#erasure-progress")
    await expect(progress).to_contain_text("Status: received")
    await page.get_by_role("button", name="Verify identity").click()
    await expect(progress).to_contain_text("Status: verified")
    await page.get_by_role("button", name="Discover").click()
    await expect(progress).to_contain_text("Status: discovered")
    await page.get_by_role("button", name="Decide: erase every layer").click()
    await expect(progress).to_contain_text("Status: decided")
    await page.get_by_role("button", name="Execute erasure").click()
    await expect(progress).to_contain_text("Status: completed", timeout=60_000)
    await expect(progress).to_contain_text("6 of 6 layers done")
    evidence = page.locator("#evidence-table tbody tr")
    await expect(evidence).to_have_count(6)
    await expect(page.locator("#evidence-table")).to_contain_text("memory_store")
    await page.screenshot(path=shots(tmp_path) / "console-erasure.png", full_page=True)

    requests = (await memgate.ok("GET", "/api/admin/erasure-requests", ADMIN_TOKEN))["requests"]
    assert [r["status"] for r in requests] == ["completed"]
    memory_store = next(e for e in requests[0]["evidence"] if e["layer"] == "memory_store")
    assert memory_store["erased"] == 2
    # the member's token no longer works
    gone = await memgate.admin("GET", "/api/me", member.token)
    assert gone.status_code == 401

    await page.get_by_role("button", name="Operations").click()
    await page.get_by_role("button", name="Verify the audit log").click()
    await expect(page.locator("#audit-result")).to_contain_text("The audit log's chain holds")
    await expect(page.locator("#health-table")).to_contain_text("storage")
    await expect(page.locator("#health-table")).not_to_contain_text("waiting")
    # every store is kept and served by this node (its name: the host's, by default)
    cluster = page.locator("#cluster-table")
    await expect(cluster).to_contain_text("storage.p0")
    await expect(cluster.locator("tr", has_text="storage.p0")).to_contain_text(
        socket.gethostname())
    await expect(cluster).not_to_contain_text("nobody")
    scraped = await memgate.admin("GET", "/metrics", ADMIN_TOKEN)
    if scraped.status_code == 200:
        await expect(page.locator("#bus-table")).not_to_contain_text("not available")
        assert FAILURES[page] == []
    else:  # the page says so, and the browser logs the one refused fetch
        await expect(page.locator("#bus-table")).to_contain_text("metrics not available")
        assert len(FAILURES[page]) == 1


async def test_a_page_never_shows_another_members_memories(
        memgate: Memgate, browser: Browser) -> None:
    owner = await memgate.workspace()
    alice, bob = await memgate.member(owner), await memgate.member(owner)
    for member, text in ((alice, "alice-canary-7F3A collects stamps"),
                         (bob, "bob-canary-91QZ plays the oboe"),
                         (owner, "owner-canary-55KD runs marathons")):
        await RestAgent(memgate.http, await memgate.credential(member)).remember("hobby", text)
    other = await memgate.workspace()
    await RestAgent(memgate.http, await memgate.credential(other)).remember(
        "hobby", "other-canary-X2 sails")

    for member, mine in ((alice, "alice-canary"), (bob, "bob-canary"), (owner, "owner-canary")):
        page = await signed_in(browser, memgate, member.token)
        await expect(page.locator("#memories-table tbody tr")).to_have_count(1)
        content = await page.content()
        assert mine in content
        assert [c for c in ("alice-canary", "bob-canary", "owner-canary", "other-canary")
                if c in content] == [mine]
        # even the owner's workspace view lists members and credentials, never memories
        if member is owner:
            await page.get_by_role("button", name="Workspace").click()
            await expect(page.locator("#members-table tbody tr")).to_have_count(3)
            content = await page.content()
            assert not any(c in content for c in ("alice-canary", "bob-canary"))
        await page.context.close()


async def test_every_control_has_an_accessible_name_and_the_page_a_strict_policy(
        memgate: Memgate, browser: Browser) -> None:
    owner = await memgate.workspace()
    response = await memgate.http.get("/console")
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "'unsafe-inline'" not in policy and "frame-ancestors 'none'" in policy
    page = await signed_in(browser, memgate, owner.token)
    unnamed = await page.evaluate("""() => [...document.querySelectorAll(
        'button, input, select, textarea')].filter((c) => {
          const name = (c.getAttribute('aria-label') || '').trim()
            || [...(c.labels || [])].map((l) => l.textContent.trim()).join('')
            || (c.tagName === 'BUTTON' ? c.textContent.trim() : '');
          return !name;
        }).map((c) => c.id || c.outerHTML.slice(0, 80))""")
    assert unnamed == []
    # an inline script is refused by the policy, so an injected one could not run either
    blocked = await page.evaluate("""() => new Promise((done) => {
        document.addEventListener('securitypolicyviolation', () => done(true), {once: true});
        const s = document.createElement('script'); s.textContent = 'window.ran = 1';
        document.body.append(s); setTimeout(() => done(window.ran !== 1 && false), 1000);
    })""")
    assert blocked is True
    await page.get_by_role("button", name="Sign out").click()
    assert await page.evaluate("() => sessionStorage.length") == 0
    await expect(page.get_by_label("Member token or operator token")).to_be_focused()
