"""A non-retaining workspace keeps no history on any surface (SPEC §2.2, §4; #28 finding 10)."""

from __future__ import annotations

from tests.conftest import Memgate
from tests.test_spaces import call, code, enable


async def test_a_non_retaining_workspace_refuses_spaces_mem0_sessions_and_events(
        memgate: Memgate) -> None:
    owner = await memgate.workspace(non_retaining=True)
    await enable(memgate, owner, owner)

    created = await call(memgate, "POST", "/memory/spaces", owner.token, {"description": "bot"})
    assert (created.status_code, code(created)) == (403, "NON_RETAINING_WORKSPACE")
    listed = await call(memgate, "GET", "/memory/spaces", owner.token)
    assert (listed.status_code, code(listed)) == (403, "NON_RETAINING_WORKSPACE")

    # whatever space id is named, nothing is kept: not a mem0 add, a session or an event
    space = "sp_" + "0" * 24
    added = await call(memgate, "POST", f"/memory/{space}/v3/memories/add/", owner.token,
                       {"messages": [{"role": "user", "content": "I deploy on Fridays"}],
                        "user_id": "alice"}, scheme="Token")
    assert (added.status_code, code(added)) == (403, "NON_RETAINING_WORKSPACE")
    session = await call(memgate, "POST", f"/memory/{space}/sessions", owner.token,
                         {"participants": ["a" * 24]})
    assert (session.status_code, code(session)) == (403, "NON_RETAINING_WORKSPACE")
    event = await call(memgate, "POST", f"/memory/{space}/sessions/{'b' * 24}/events",
                       owner.token, {"body": {"text": "hi"}, "emitter": {"type": "user",
                                                                        "id": "a" * 24},
                                     "eventType": "message"})
    assert (event.status_code, code(event)) == (403, "NON_RETAINING_WORKSPACE")
