"""The coordinator's reconciler: what its launcher runs, told to Gantry; Gantry's stop orders, carried out.

It runs on a thread of its own with a client of its own (its own HTTP
connections), so a long poll parked in the coordinator's main loop never
delays it. A turn comes every ``interval`` seconds, and at once when the
launcher says a worker exited (:meth:`Launcher.notify_exit`) or a stop
finished:

0. **warm**: with warm runners (``runners.warm``), the dead ones are forgotten
   (they held no run) and the pool is topped up to its size;
1. **reap**: every worker that is no longer alive is reaped (its last lines
   read first), logged as ``worker.exited`` with its exit code and how long
   it ran, and kept as an *exit* to report; a live worker whose launch can
   never start its runner (:meth:`Launcher.startup_failure`) is stopped,
   reaped and reported as dispatch-failed, as before;
2. **report**: ``POST /runner-groups/reconcile`` with every live worker
   (``running``) and every exit the server has not settled yet (``exited``).
   Gantry fails the run of a worker that died under it at once, and answers
   the running workers whose run no longer needs them;
3. **stop**: each of those goes to :meth:`Launcher.terminate` on a short-lived
   thread (its grace period must not hold up the next turn); its exit wakes
   the next turn, which reaps it and reports it.

A report that fails is backed off (:class:`runners.client.Backoff`) and its
exits are kept for the next one: the report is idempotent, so repeating it is
always safe. Nothing is reported while there is nothing to say.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gantry_wire.logsetup import event
from gantry_wire.protocol import RECONCILE_MAX_WORKERS, TERMINAL_STATUSES
from launchers.base import Launcher, LaunchError, WorkerHandle
from runners.client import ApiError, Backoff, GantryClient, RetryPolicy

if TYPE_CHECKING:
    from runners.warm import WarmPool

log = logging.getLogger("gantry.coordinator")

# The server's bound on workers per report (docs/protocol.md); and what this
# side sends of an exited worker's last lines (count, characters each), well
# within the server's bounds on them.
MAX_WORKERS = RECONCILE_MAX_WORKERS
LAST_LINES = 20
LINE_CHARS = 500
# Exits kept for the next report while Gantry cannot be reached; past this the
# oldest are dropped (the inactive-runner reaper then fails their runs).
MAX_KEPT_EXITS = 5000
# terminate() waits the runner's own grace (it stops its step in that time and
# reports) plus this, before it forces the worker.
STOP_MARGIN = 5.0
# A worker whose runner row is gone while its run is terminal has, nearly
# always, just deregistered and is exiting on its own: it gets this long to do
# so before it is stopped, so its own exit code is the one reaped.
EXIT_GRACE = 3.0
EXIT_POLL = 0.1


def describe(handle: WorkerHandle) -> str:
    return f"pid {handle.ident}" if handle.kind == "local" else f"{handle.kind} worker {handle.ident}"


class Fleet:
    """The coordinator's workers by run id, shared by its poll loop and its reconciler."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._workers: dict[str, WorkerHandle] = {}

    def add(self, handle: WorkerHandle) -> None:
        with self._changed:
            self._workers[handle.run_id] = handle

    def remove(self, run_id: str) -> None:
        with self._changed:
            self._workers.pop(run_id, None)
            self._changed.notify_all()

    def get(self, run_id: str) -> WorkerHandle | None:
        with self._changed:
            return self._workers.get(run_id)

    def handles(self) -> list[WorkerHandle]:
        with self._changed:
            return list(self._workers.values())

    def snapshot(self) -> dict[str, WorkerHandle]:
        with self._changed:
            return dict(self._workers)

    def __len__(self) -> int:
        with self._changed:
            return len(self._workers)

    def wait_for_room(self, capacity: int, timeout: float) -> bool:
        """Block until fewer than ``capacity`` workers remain (a worker was reaped), at most ``timeout`` s."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._workers) < capacity, timeout)


class Reconciler:
    """See the module docstring. ``dispatch_failed`` reports a launch that can never start."""

    def __init__(
        self,
        *,
        client: GantryClient,
        launcher: Launcher,
        fleet: Fleet,
        interval: float,
        backoff: RetryPolicy,
        stop_grace: float,
        dispatch_failed: Callable[[WorkerHandle, LaunchError], None],
        warm: WarmPool | None = None,
    ) -> None:
        self.client = client
        self.launcher = launcher
        self.fleet = fleet
        self.interval = interval
        self.stop_grace = stop_grace
        self._dispatch_failed = dispatch_failed
        self.warm = warm
        self._backoff = Backoff(backoff)
        self._report_after = 0.0  # monotonic; a failed report holds the next one back
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._turn = threading.Lock()
        self._lock = threading.Lock()  # guards _stoppers
        self._stoppers: dict[str, threading.Thread] = {}
        # Exits not settled by Gantry yet, oldest first (by run id).
        self.exits: dict[str, dict[str, Any]] = {}
        self._thread: threading.Thread | None = None
        # For tests and metrics.
        self.reports = 0
        self.stops = 0
        launcher.exit_listener = self.wake

    # ------------------------------------------------------------ the thread

    def wake(self) -> None:
        """Take a turn now (safe from any thread)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        """The thread runs, or was never started (a coordinator still checking its server, tests' turns)."""
        return self._thread is None or self._thread.is_alive() or self._stopped.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="reconcile", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """End the thread after a last turn (what exited meanwhile is still reported)."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            stopping = self._stopped.is_set()
            try:
                self.turn()
            except Exception:  # a bug here must not end reconciling for the daemon's life
                log.exception("reconcile turn failed", extra={"event": "reconcile.crashed"})
            if stopping:
                return
            self._wake.wait(self.interval)
            self._wake.clear()

    # ------------------------------------------------------------ a turn

    def turn(self) -> None:
        """Reap, report, stop (see the module docstring)."""
        with self._turn:
            if self.warm is not None and not self._stopped.is_set():
                try:
                    self.warm.maintain()
                except Exception:  # a launcher's fault with warm runners must not stop the busy ones' turn
                    log.exception("launcher error with the warm runners", extra={"event": "warm.crashed"})
            self._reap()
            if time.monotonic() < self._report_after:
                return
            for order in self._report():
                self._stop(order)

    def _reap(self) -> None:
        for handle in self.fleet.handles():
            try:
                self._look_at(handle)
            except Exception:  # a launcher's fault with one worker must not stop the others' turn
                log.exception("launcher error while looking at a worker",
                              extra={"event": "reconcile.launcher_error", "run_id": handle.run_id})  # fmt: skip

    def _look_at(self, handle: WorkerHandle) -> None:
        if self.launcher.is_alive(handle):
            if self._is_stopping(handle.run_id):
                return
            failure = self.launcher.startup_failure(handle)
            if failure is None:
                return
            # Launched, but it will never start its runner (an image that does
            # not pull): stop it and fail the run as a dispatch failure.
            self.launcher.terminate(handle, grace=0)
            self.launcher.reap(handle)
            self.fleet.remove(handle.run_id)
            self._dispatch_failed(handle, failure)
            return
        # The lines first: reap may delete them (a container, a Pod).
        lines = self.launcher.last_lines(handle, LAST_LINES)
        code = self.launcher.reap(handle)
        self.fleet.remove(handle.run_id)
        seconds = round(max(0.0, time.time() - handle.started_at), 3)
        event(log, "worker.exited", "worker for run %s exited with code %s after %.1fs", handle.run_id,
              "unknown" if code is None else code, seconds, run_id=handle.run_id, runner_id=handle.runner_id,
              worker=handle.ident, exit_code=code, seconds=seconds)  # fmt: skip
        self.add_exit(handle, code, lines, seconds)

    def add_exit(self, handle: WorkerHandle, code: int | None, lines: list[str], seconds: float | None) -> None:
        """Keep an exit to report until Gantry has settled it (``seconds`` None: how long it ran is unknown)."""
        self.exits[handle.run_id] = {
            "run_id": handle.run_id,
            "runner_id": handle.runner_id,
            "state": "exited",
            "exit_code": code,
            "last_lines": [line[:LINE_CHARS] for line in lines[-LAST_LINES:]],
            "seconds": seconds,
        }
        while len(self.exits) > MAX_KEPT_EXITS:
            dropped = next(iter(self.exits))
            del self.exits[dropped]
            event(log, "reconcile.exit_dropped", "too many unreported exits; dropping run %s's", dropped,
                  level=logging.WARNING, run_id=dropped)  # fmt: skip

    def _report(self) -> list[dict[str, Any]]:
        """Send the report (in batches of MAX_WORKERS); answer the stop orders of every batch that went through."""
        now = time.time()
        running = [
            {"run_id": h.run_id, "runner_id": h.runner_id, "state": "running",
             "seconds": round(max(0.0, now - h.started_at), 3)}
            for h in self.fleet.handles()
        ]  # fmt: skip
        entries = running + list(self.exits.values())
        orders: list[dict[str, Any]] = []
        for batch in _batches(entries, MAX_WORKERS):
            try:
                stop, retry = self.client.reconcile(batch)
            except ApiError as exc:
                delay = self._backoff.failed()
                self._report_after = time.monotonic() + delay
                event(log, "reconcile.backoff", "reconcile report failed (%s); next in %.1fs", exc, delay,
                      level=logging.WARNING, seconds=round(delay, 3), failures=self._backoff.failures,
                      status=exc.status)  # fmt: skip
                return orders
            self.reports += 1
            again = {(str(r.get("run_id")), str(r.get("runner_id"))) for r in retry}
            for entry in batch:
                if entry["state"] == "exited" and (entry["run_id"], entry["runner_id"]) not in again:
                    self.exits.pop(entry["run_id"], None)
            orders.extend(stop)
        self._backoff.succeeded()
        return orders

    def _stop(self, order: dict[str, Any]) -> None:
        run_id = str(order.get("run_id"))
        handle = self.fleet.get(run_id)
        # Only a worker we hold, for that very runner; an order repeated while it stops changes nothing.
        if handle is None or handle.runner_id != str(order.get("runner_id")):
            return
        with self._lock:
            if run_id in self._stoppers:
                return
            finishing = order.get("reason") == "runner_gone" and order.get("run_status") in TERMINAL_STATUSES
            thread = threading.Thread(target=self._terminate, args=(handle, finishing), name=f"stop-{run_id}",
                                      daemon=True)  # fmt: skip
            self._stoppers[run_id] = thread
        self.stops += 1
        event(log, "worker.stopping", "stopping %s for run %s: %s (run %s)", describe(handle), run_id,
              order.get("reason"), order.get("run_status"), run_id=run_id, runner_id=handle.runner_id,
              worker=handle.ident, reason=order.get("reason"), run_status=order.get("run_status"))  # fmt: skip
        thread.start()

    def _terminate(self, handle: WorkerHandle, finishing: bool = False) -> None:
        try:
            if finishing and self._exits_by_itself(handle):
                return
            self.launcher.terminate(handle, grace=self.stop_grace + STOP_MARGIN)
        except Exception:
            log.exception("launcher error while stopping a worker",
                          extra={"event": "reconcile.launcher_error", "run_id": handle.run_id})  # fmt: skip
        finally:
            with self._lock:
                self._stoppers.pop(handle.run_id, None)
            self.wake()  # reap it now

    def _exits_by_itself(self, handle: WorkerHandle) -> bool:
        deadline = time.monotonic() + EXIT_GRACE
        while time.monotonic() < deadline and not self._stopped.is_set():
            try:
                if not self.launcher.is_alive(handle):
                    return True
            except Exception:
                return False  # the launcher cannot tell: stop it the ordinary way
            time.sleep(EXIT_POLL)
        return False

    def _is_stopping(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._stoppers

    def stopping(self) -> list[str]:
        """The run ids of the workers being stopped now."""
        with self._lock:
            return sorted(self._stoppers)


def _batches(entries: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(entries), size):
        yield entries[start : start + size]
