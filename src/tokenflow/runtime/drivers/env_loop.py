"""The asyncio loop environments run on: one daemon thread per engine worker.

Environment calls (``reset``, ``step``) are coroutines; the engine worker's loop is plain
synchronous Python. `EnvLoop.submit` hands a call to the loop and returns a
`concurrent.futures.Future` the worker polls between engine steps, so decoding never waits on
an environment.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future


class EnvLoop:
    """One asyncio loop on a daemon thread, for every environment of this engine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="env-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        # Stopped by `close`. If a blocking environment held the loop past close's wait, its
        # tasks are still here: cancel them on this thread and let them unwind, so none is
        # destroyed pending (and none wakes later in a process that has moved on).
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def submit(self, make_coro, timeout: float) -> Future:
        """Run ``make_coro()`` on the loop under ``timeout``. The coroutine is made on the loop,
        when it starts, so a call cancelled before it starts leaves no coroutine unawaited."""
        fut: Future = Future()

        def start() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            task = self.loop.create_task(asyncio.wait_for(make_coro(), timeout))
            fut.task = task

            def done(t: asyncio.Task) -> None:
                if t.cancelled():
                    fut.set_exception(asyncio.CancelledError())
                elif t.exception() is not None:
                    fut.set_exception(t.exception())
                else:
                    fut.set_result(t.result())

            task.add_done_callback(done)

        self.loop.call_soon_threadsafe(start)
        return fut

    def cancel(self, fut: Future) -> None:
        if not fut.cancel():  # already started: cancel its task on the loop
            task = getattr(fut, "task", None)
            if task is not None and not self.loop.is_closed():  # closed: every task was cancelled
                self.loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        """Cancel what still runs (its environments are closed by then), then stop the loop. A
        loop that a blocking environment holds is left to its daemon thread after a second; the
        thread cancels what is left when the environment lets go (`_run`)."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=1.0)
        except Exception:  # noqa: BLE001 - a blocked loop: nothing more to do for it
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=1.0)
