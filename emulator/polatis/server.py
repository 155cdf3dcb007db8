"""A server that runs its own asyncio loop, in a background thread or in the foreground.

Tests and the experiment runner call :meth:`BackgroundServer.start` / :meth:`~.stop` (or use it
as a context manager); ``opus-testbed ocs simulate`` calls :meth:`~.serve_forever`, which
returns when the process gets Ctrl-C or SIGTERM (the CLI turns SIGTERM into KeyboardInterrupt).
Servers bind only the host they are given (127.0.0.1 by default) and port 0 picks a free port:
read it from :attr:`port` after ``start``.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from typing import Any, Self


class BackgroundServer(abc.ABC):
    """Owns an event loop in a thread; subclasses implement :meth:`_start` and :meth:`_stop`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    @abc.abstractmethod
    async def _start(self) -> int:
        """Start listening; return the bound port."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Close the listener and every session."""

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self, timeout_s: float = 10.0) -> Self:
        """Start serving in a background thread; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, args=(loop,), daemon=True,
                                        name=f"{type(self).__name__}")
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and join the thread; idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(self._stop(), loop).result(timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            self._loop = self._thread = None
            self._stopped.set()

    def serve_forever(self) -> None:
        """Serve in the foreground until KeyboardInterrupt (Ctrl-C, or SIGTERM via the CLI)."""
        if self._thread is None:
            self.start()
        try:
            self._stopped.wait()
        finally:
            self.stop()

    def call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        """Run a coroutine on the server's loop from another thread (for tests)."""
        assert self._loop is not None, "server not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
