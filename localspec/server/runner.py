"""Running ``localspec serve``'s application under uvicorn until SIGTERM or Ctrl-C, which cancel the
generations it would otherwise wait for."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import uvicorn
from fastapi import FastAPI

from .worker import Server


class _Uvicorn(uvicorn.Server):
    """uvicorn, with SIGTERM and Ctrl-C cancelling the generations it would otherwise wait for."""

    def __init__(self, config: uvicorn.Config, server: Server):
        super().__init__(config)
        self.localspec = server
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.loop is not None:  # a signal handler: the jobs are the loop's to touch
            self.loop.call_soon_threadsafe(self.localspec.stop)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets)
        # The worker finishes its cancelled generation (and records it) before the process goes.
        await asyncio.get_running_loop().run_in_executor(None, self.localspec.close)


def run(server: Server, app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM or Ctrl-C, which cancel the generations and end the process within seconds."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
    _Uvicorn(config, server).run()
