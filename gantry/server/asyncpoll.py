"""Parked long polls on an event loop: no thread and no database connection while parked.

Under the production server (gantry.server.asgi) a poll runs in three steps:

1. Its first attempt runs in a thread of a small pool: the fast lane's
   (gantry.server.lane) for a plain request, else the ordinary Django view
   (``PollView``), each authenticating, validating and trying the claim once,
   exactly as under WSGI. When it finds nothing and ``wait`` allows, it does
   not wait: it records a :class:`Deferred` (the group, the org, the wait;
   the view finds it in the request's environ) and answers its 204, which
   the event loop keeps for the deadline.
2. The event loop parks the poll in the :class:`Hub`: a future in a per-org
   FIFO, holding no thread and no database connection.
3. A wake makes one claim attempt for the group the first attempt
   authenticated, in a thread of its own; its answer is sent (a run won, or a
   throttle's 204), or the poll parks again where it was.

Who is woken (the issue's "as many as new runs can satisfy, not all"): a
``gantry_claimable`` NOTIFY (payload: the org id; the triggers of migration
0004, one message per org per transaction) wakes *one* idle waiter of that
org, the oldest. After any attempt, won or empty, one cheap query
(:func:`claimable_counts`: which groups with parked polls could claim now, and
about how many runs) decides whether to pass the wake on, and to how many
waiters of which groups: so a run another group must serve reaches that group,
and a transaction that made many runs claimable (one NOTIFY) wakes as many
waiters as it has runs, without any waiter trying a claim that cannot win.

A NOTIFY that arrives while no waiter of its org is idle (all in an attempt)
is kept as a *credit* for a few seconds: an attempt that began before it and
found nothing uses it to try once more instead of parking past the run.

A lost NOTIFY (the listener reconnecting; the listener then asks for a sweep at
once) is bounded by the sweep: every 5 s (jittered; GANTRY_POLL_RECHECK_SECONDS) the same
query runs over every group with parked polls and wakes only where a claim can
win. A sweep with nothing claimable costs one query per process, no claim.

On SIGTERM (:func:`gantry.dispatch.longpoll.begin_shutdown`) every parked poll
is answered its 204 at once and new polls do not park.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from prometheus_client import Counter, Gauge

from gantry import conf, metrics
from gantry.dispatch import longpoll
from gantry.sql import claim as claim_sql

log = logging.getLogger("gantry.asyncpoll")

# The environ key PollView looks for (set by gantry.server.asgi on the poll route only).
ENVIRON_KEY = "gantry.poll.deferred"

# How long a NOTIFY nobody was idle to take stays usable by an attempt that overlapped it.
CREDIT_SECONDS = 5.0
# A follower process (not the leader, gantry.dispatch.longpoll.LEADER_LOCK) looks
# again 1-2 times this long after a NOTIFY, by when the leader's waiter has claimed.
FOLLOWER_DELAY = 0.5
# Cap of the run estimate per group (the query reads no further).
ESTIMATE_CAP = claim_sql.CLAIMABLE_ESTIMATE_CAP

FIRST, WAKE, SHUTDOWN = "first", "wake", "shutdown"

CLAIM_ATTEMPTS = Counter(
    "gantry_poll_claim_attempts_total",
    "Claim attempts made by runner-group polls in this process: a poll's first attempt, or one after a wake.",
    ["kind"],
)
for _kind in (FIRST, WAKE):
    CLAIM_ATTEMPTS.labels(_kind)  # each series exists (at 0) before its first attempt
PARKED = Gauge("gantry_poll_parked", "Long polls parked on this process's event loop (no thread, no connection).")


@dataclass
class Deferred:
    """What the first attempt leaves for the event loop: set by the lane or the view, read by gantry.server.asgi."""

    retry: bool = False  # a wake: one attempt, never park
    group: Any = None  # the authenticated group (a wake claims for it without a second pass)
    group_id: int | None = None
    org_id: int | None = None
    wait: float = 0.0
    empty: bool = False  # the attempt found nothing and the poll may park

    def attempt(self, *, group: Any, wait: float, claim: Callable[[], Any]) -> Any:
        """One claim attempt (the lane's or the view's); on nothing, mark the poll parkable instead of waiting."""
        count_attempt(WAKE if self.retry else FIRST)
        result = claim()
        if result is None and wait > 0 and not longpoll.shutting_down():
            self.group, self.group_id, self.org_id = group, group.id, group.organization_id
            self.wait, self.empty = wait, True
        return result


# Attempts not yet added to the fleet-wide figure (gantry.metrics sums them over processes).
_unflushed: dict[str, int] = {FIRST: 0, WAKE: 0}
_unflushed_lock = threading.Lock()


def count_attempt(kind: str) -> None:
    CLAIM_ATTEMPTS.labels(kind).inc()
    with _unflushed_lock:
        _unflushed[kind] += 1


def flush_counts() -> None:
    """Add this process's attempts since the last flush to the fleet-wide figure (one Redis call, fails open)."""
    with _unflushed_lock:
        counts = dict(_unflushed)
        for kind in _unflushed:
            _unflushed[kind] = 0
    if any(counts.values()):
        metrics.record_poll_attempts(counts)


def deferred_of(meta: Any) -> Deferred | None:
    value = meta.get(ENVIRON_KEY)
    return value if isinstance(value, Deferred) else None


# ---------------------------------------------------------------- what could claim now


def claimable_counts(group_ids: list[int]) -> dict[int, tuple[int, int]]:
    """{group id: (org id, about how many runs it could claim now)} for the groups that could claim one.

    The claim's own eligibility (drain, capacity, selector containment, the
    org's default group, the pending-run index), read without locking
    anything. The same partial index as the claim, at most ESTIMATE_CAP rows
    per selector. Called in a pool thread; the connection goes back at once.
    """
    if not group_ids:
        return {}
    try:
        with connection.cursor() as cur:
            cur.execute(claim_sql.CLAIMABLE_COUNTS, {"groups": group_ids})
            rows = cur.fetchall()
    finally:
        connection.close()  # back to the pool: nothing parks holding it
    return {gid: (org, int(n)) for gid, org, n in rows if n and n > 0}


# ---------------------------------------------------------------- the waiters


@dataclass(eq=False)
class Waiter:
    group_id: int
    org_id: int
    deadline: float
    seq: int
    future: asyncio.Future[str] = field(repr=False)
    busy: bool = False  # in an attempt (not parked)


class Hub:
    """The event loop's parked polls; every method runs on the loop's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        check: Callable[[list[int]], Any],
        leader: Callable[[], bool] = lambda: True,
        forward: Callable[[int], Any] | None = None,
    ) -> None:
        self.loop = loop
        self._leader = leader
        # forward(org) -> awaitable: NOTIFY FOLLOW_CHANNEL, for the other processes' waiters.
        self._forward = forward
        # check(group_ids) -> awaitable of claimable_counts(...): in the pool (gantry.server.asgi supplies it).
        self._check = check
        self._orgs: dict[int, dict[int, Waiter]] = {}  # org -> {seq: waiter}, in park order (FIFO)
        self._credits: dict[int, deque[float]] = {}  # org -> monotonic times of NOTIFYs nobody took
        self._notified: dict[int, int] = {}  # org -> sequence number of its last NOTIFY
        self._seq = itertools.count(1)
        self._note_seq = 0
        self._checking: set[int] = set()  # orgs with a hand-off query in flight (None: a sweep)
        self._sweep_task: asyncio.Task[None] | None = None
        self._closed = False

    # ---- notifications (scheduled onto the loop by the listener thread)

    def notify_threadsafe(self, org_id: int | None, forwarded: bool = False) -> None:
        """The listener thread's callback: None means "anything may have been missed" (a reconnect)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self.loop.call_soon_threadsafe(self._on_notify, org_id, forwarded)

    def shutdown_threadsafe(self) -> None:
        """Safe in a signal handler: no lock is taken."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.shutdown)

    def mark(self) -> int:
        """The notification sequence number now: an attempt reads it before it starts."""
        return self._note_seq

    def _on_notify(self, org_id: int | None, forwarded: bool = False) -> None:
        """One NOTIFY: the leader wakes its oldest idle waiter of the org, or hands the NOTIFY on.

        Every server process hears every NOTIFY. Were each to wake a waiter,
        one run would cost one claim attempt per process. So the leader's
        waiters go first; when it has none idle for the org, it NOTIFYs
        FOLLOW_CHANNEL and the other processes wake one each. A follower also
        looks a little later (one read, no claim unless a run is still
        claimable): the leader's waiters may all be of groups the run does
        not fit.
        """
        if org_id is None:
            self.spawn(self._sweep_once())
            return
        leader = self._leader()
        if forwarded:
            if not leader:
                self._wake_oldest(org_id)
            return
        self._note_seq += 1
        self._notified[org_id] = self._note_seq
        if not leader:
            self.loop.call_later(FOLLOWER_DELAY * random.uniform(1, 2), self._follow, org_id)
            return
        if not self._wake_oldest(org_id):
            credits = self._credits.setdefault(org_id, deque(maxlen=ESTIMATE_CAP))
            credits.append(time.monotonic())
            if self._forward is not None:
                self.spawn(self._forward(org_id))

    def _follow(self, org_id: int) -> None:
        if not self._closed and org_id not in self._checking and self._idle(org_id):
            self._checking.add(org_id)
            self.spawn(self._hand_off([org_id]))

    # ---- parking

    def waiter(self, *, group_id: int, org_id: int, deadline: float) -> Waiter:
        w = Waiter(group_id, org_id, deadline, next(self._seq), self.loop.create_future(), busy=True)
        self._orgs.setdefault(org_id, {})[w.seq] = w
        PARKED.inc()
        return w

    def should_retry(self, w: Waiter, mark: int) -> bool:
        """After an empty attempt begun at ``mark``: did a NOTIFY nobody took arrive meanwhile? Uses it."""
        if self._notified.get(w.org_id, 0) <= mark:
            return False
        credits = self._credits.get(w.org_id)
        now = time.monotonic()
        while credits and credits[0] < now - CREDIT_SECONDS:
            credits.popleft()
        if credits:
            credits.popleft()
            return True
        return False

    def park(self, w: Waiter) -> asyncio.Future[str]:
        """Back to idle in its place in the FIFO; the future resolves with WAKE or SHUTDOWN."""
        w.busy = False
        if w.future.done():
            w.future = self.loop.create_future()
        if self._closed:
            w.future.set_result(SHUTDOWN)
        self._ensure_sweeper()
        return w.future

    def begin_attempt(self, w: Waiter) -> None:
        w.busy = True

    def remove(self, w: Waiter) -> None:
        waiters = self._orgs.get(w.org_id)
        if waiters is not None and waiters.pop(w.seq, None) is not None:
            PARKED.dec()
            if not waiters:
                del self._orgs[w.org_id]
                self._credits.pop(w.org_id, None)

    # ---- waking

    def _idle(self, org_id: int) -> list[Waiter]:
        return [w for w in self._orgs.get(org_id, {}).values() if not w.busy and not w.future.done()]

    def _wake(self, w: Waiter) -> None:
        w.busy = True
        w.future.set_result(WAKE)

    def _wake_oldest(self, org_id: int) -> bool:
        idle = self._idle(org_id)
        if not idle:
            return False
        self._wake(idle[0])
        return True

    def after_attempt(self, w: Waiter) -> None:
        """An attempt ended (won, empty or answered otherwise): pass the wake on where a run may be claimable."""
        if self._closed or w.org_id in self._checking:
            return  # the query in flight will see this attempt's outcome too
        if self._idle(w.org_id):
            self._checking.add(w.org_id)
            self.spawn(self._hand_off([w.org_id]))

    async def _hand_off(self, orgs: list[int]) -> None:
        try:
            groups = sorted({w.group_id for org in orgs for w in self._idle(org)})
            counts = await self._check(groups) if groups else {}
        except Exception:
            log.exception("long-poll hand-off query failed", extra={"event": "longpoll.handoff_error"})
            counts = {}
        finally:
            self._checking.difference_update(orgs)
        for org in orgs:
            self._grant(org, {g: n for g, (o, n) in counts.items() if o == org})

    def _grant(self, org_id: int, runs: dict[int, int]) -> None:
        """Wake, oldest first, as many idle waiters as the estimate says can win, per group and in all."""
        if not runs:
            return
        busy = sum(1 for w in self._orgs.get(org_id, {}).values() if w.busy)
        # Groups of one org share runs: the largest group estimate bounds the distinct runs.
        budget = max(runs.values()) - busy
        for w in self._idle(org_id):
            if budget <= 0:
                break
            if runs.get(w.group_id, 0) > 0:
                runs[w.group_id] -= 1
                budget -= 1
                self._wake(w)

    # ---- the periodic re-check

    def _ensure_sweeper(self) -> None:
        if self._sweep_task is None or self._sweep_task.done():
            self._sweep_task = self.loop.create_task(self._sweeper())

    async def _sweeper(self) -> None:
        while not self._closed and self._orgs:
            # The bound on how late a lost notification can make a parked poll (plus
            # jitter): GANTRY_POLL_RECHECK_SECONDS, a diagnostic (docs/configuration.md).
            await asyncio.sleep(conf.server().poll_recheck_seconds * random.uniform(0.8, 1.2))
            await self._sweep_once()

    async def flusher(self, flush: Callable[[], Any], seconds: float = 1.0) -> None:
        """Every second, hand this process's attempt counts to ``flush`` (in the pool: it calls Redis)."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await flush()
            except Exception:
                log.warning("could not flush long-poll counts", exc_info=True)

    async def _sweep_once(self) -> None:
        orgs = [org for org in self._orgs if org not in self._checking and self._idle(org)]
        if orgs:
            self._checking.update(orgs)
            await self._hand_off(orgs)

    # ---- shutdown

    def shutdown(self) -> None:
        """Every parked poll answers now (its 204); later ones do not park."""
        self._closed = True
        for waiters in self._orgs.values():
            for w in waiters.values():
                if not w.future.done():
                    w.future.set_result(SHUTDOWN)

    def spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        _background.add(task)
        task.add_done_callback(_background.discard)


# Strong references to fire-and-forget tasks (the loop keeps only weak ones).
_background: set[asyncio.Task[Any]] = set()
