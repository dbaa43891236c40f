"""What the CLI runs until a signal: the worker, the ingress, ``up``."""

from __future__ import annotations

from typing import Protocol


class Service(Protocol):
    """A long-running part of the pipeline: started, run until stopped, stopped by a signal."""

    async def start(self) -> None: ...
    async def run(self) -> None: ...
    def stop(self) -> None: ...
