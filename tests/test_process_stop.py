"""A process of `memgate up` whose stop cannot end exits all the same, saying where it waited:
the supervisor restarts only a process that exited, and a node whose store process waits
forever on a refused connection serves none of its stores again (seen after a SIGSTOP)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_stop_that_cannot_end_exits_with_its_code_naming_the_task_it_waited_in() -> None:
    script = textwrap.dedent("""
        import asyncio
        from memgate.app.process import exit_soon

        async def waits_on_what_never_comes() -> None:
            await asyncio.Event().wait()

        async def main() -> None:
            exit_soon(asyncio.get_running_loop(), 0.5, 75)
            await waits_on_what_never_comes()

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 75
    assert "the stop did not end within" in done.stderr
    assert "waits_on_what_never_comes" in done.stderr
