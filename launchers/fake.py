"""An in-memory launcher for tests: records launches, fails on request, finishes workers when told.

Workers live in a :class:`FakeWorld` that several launcher instances can
share, which is how a test plays "the coordinator restarted": a new
``FakeLauncher(world=old.world)`` discovers what the old one started.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launchers import register
from launchers.base import Assignment, Launcher, LaunchError, WorkerHandle


@dataclass
class FakeWorker:
    handle: WorkerHandle
    assignment: Assignment
    alive: bool = True
    exit_code: int | None = None
    terminated: bool = False
    # Set by a test: the launch was accepted but its runner will never start.
    startup_error: str | None = None


@dataclass
class FakeWorld:
    workers: dict[str, FakeWorker] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    lock: threading.Lock = field(default_factory=threading.Lock)


@register("fake")
class FakeLauncher(Launcher):
    def __init__(self, *, world: FakeWorld | None = None, fail: str | None = None) -> None:
        """``fail``: ``permanent`` or ``transient`` makes every launch fail that way."""
        if fail not in (None, "permanent", "transient"):
            raise ValueError("fail must be 'permanent' or 'transient'")
        self.world = world or FakeWorld()
        self.fail = fail
        self.launched: list[Assignment] = []
        self.attempts = 0
        self._fail_next: list[LaunchError] = []

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        unknown = set(options) - {"fail"}
        if unknown:
            raise ValueError(f"unknown fake launcher options: {', '.join(sorted(unknown))}")
        return cls(fail=options.get("fail") or None)

    # ------------------------------------------------------------ test controls

    def fail_next(self, message: str = "fake launch failure", *, permanent: bool = True, times: int = 1) -> None:
        self._fail_next.extend(LaunchError(message, permanent=permanent) for _ in range(times))

    def finish(self, run_id: str, code: int = 0) -> None:
        """The worker of ``run_id`` exits with ``code``."""
        with self.world.lock:
            worker = self.world.workers[run_id]
            worker.alive = False
            worker.exit_code = code
        self.notify_exit()

    def worker(self, run_id: str) -> FakeWorker:
        return self.world.workers[run_id]

    def fail_startup(self, run_id: str, message: str = "fake image pull failure") -> None:
        """The worker of ``run_id`` turns out unable to start (see :meth:`Launcher.startup_failure`)."""
        with self.world.lock:
            self.world.workers[run_id].startup_error = message

    # ------------------------------------------------------------ Launcher

    def launch(self, assignment: Assignment) -> WorkerHandle:
        self.attempts += 1
        if self._fail_next:
            raise self._fail_next.pop(0)
        if self.fail:
            raise LaunchError(f"fake launcher configured to fail ({self.fail})", permanent=self.fail == "permanent")
        with self.world.lock:
            handle = WorkerHandle(
                kind=self.kind,
                run_id=assignment.run_id,
                runner_id=assignment.runner_id,
                ident=str(next(self.world.ids)),
                started_at=time.time(),
            )
            self.world.workers[assignment.run_id] = FakeWorker(handle=handle, assignment=assignment)
        self.launched.append(assignment)
        return handle

    def discover(self) -> list[WorkerHandle]:
        with self.world.lock:
            return [w.handle for w in self.world.workers.values() if w.alive]

    def is_alive(self, handle: WorkerHandle) -> bool:
        with self.world.lock:
            worker = self.world.workers.get(handle.run_id)
            return worker is not None and worker.alive

    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        with self.world.lock:
            worker = self.world.workers.get(handle.run_id)
            if worker is not None and worker.alive:
                worker.alive = False
                worker.terminated = True
                worker.exit_code = -15
        self.notify_exit()

    def startup_failure(self, handle: WorkerHandle) -> LaunchError | None:
        with self.world.lock:
            worker = self.world.workers.get(handle.run_id)
            if worker is None or worker.startup_error is None:
                return None
            return LaunchError(worker.startup_error, permanent=True)

    def reap(self, handle: WorkerHandle) -> int | None:
        with self.world.lock:
            worker = self.world.workers.pop(handle.run_id, None)
            return worker.exit_code if worker is not None else None
