"""The backend dispatcher: Gantry's own poll for github_actions groups (docs/design.md, "Per-org runs/hour
throttle", "Cross-org fairness", "One Runner Per Run"; docs/github-actions.md).

A tick:

1. tries again the launches a transient GitHub refusal deferred, once due;
2. lists a bounded batch of candidates (``candidates.list_candidates``:
   deferred orgs, orgs at their in-flight cap, drained and full groups, and
   runs whose runner may still boot are skipped there), oldest first;
3. for each, claims through the one claim function (``claim.claim``: the same
   statement, the same throttle seam with ``raise_throttled=True``, the same
   stub runner and lease as a poll) for a group that can take it, and
   dispatches the group's workflow with the GitHub Actions launcher. A
   throttle answer stops that org for the rest of the tick (it is not
   contention: trying its next run would only roll back again); an empty
   claim (a SKIP LOCKED miss, a group that filled up) moves on, and that group
   is not asked again this tick;
4. runs the passes against GitHub (``workflows``): cancel the workflow runs
   of runners that can no longer accept, and of runs whose cancellation their
   runner did not carry out in time, and settle the runs whose workflow run
   ended without Gantry hearing ``done``;
5. records its figures (``gantry.metrics.record_dispatch_tick``), over only
   the candidates it could serve: an org the throttle refused during the tick
   is dropped, so ``gantry_dispatch_batch_saturated_total`` and
   ``gantry_dispatch_oldest_dispatchable_age_seconds`` say "add dispatcher
   capacity", never "this org's budget is spent" (that is
   ``gantry_org_run_dispatch_total{outcome="limited"}``).

GitHub is called after the claim's transaction has committed, never inside
one. A definitive refusal (404, 422, 403) fails the run at once through
``services.dispatch_failed`` (run failed, lane promoted, stub deleted,
``last_dispatch_error`` recorded); a transient one (5xx, rate limit, network)
keeps the claim and tries again at the time GitHub named (``Retry-After``,
``x-ratelimit-reset``) or with backoff, as long as the lease leaves the runner
time to boot and accept, then fails the run with the last error. A rate limit
pauses new claims too, so no run is claimed that cannot be dispatched.

Two dispatchers at once are safe: a run is claimed once (the claim's
``FOR UPDATE SKIP LOCKED``, and the group row lock for its capacity), and an
org is dispatched for by one dispatcher at a time (a session advisory lock
per org, ``candidates.try_lock_org``, under which its room is re-read), so the
in-flight cap holds. The second dispatcher skips the orgs the first holds.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType

from django.db import connection
from django.utils import timezone

from gantry import conf, metrics
from gantry.core import services
from gantry.core.errors import GantryError
from gantry.core.models import Run, RunnerGroup, RunStatus
from gantry.dispatch import candidates, longpoll, throttle, workflows
from gantry.dispatch.claim import Claim, Throttled, claim
from launchers.base import Assignment, LaunchError

log = logging.getLogger("gantry.dispatcher")

# A launch is tried again only while this much of its lease is left: the
# workflow run still has to boot (about a minute on GitHub's runners) and accept.
BOOT_MARGIN = timedelta(seconds=120)
# Backoff when GitHub named no time to come back.
RETRY_BASE = 2.0
RETRY_CAP = 60.0
# Least time between two ticks a burst of notifications triggers.
MIN_GAP = 0.2


@dataclass
class Deferred:
    """A claimed run whose workflow dispatch GitHub refused for now."""

    claim: Claim
    group_id: int
    organization_id: int
    attempts: int
    not_before: datetime
    last_error: str


@dataclass
class TickResult:
    now: datetime
    candidates: int = 0
    servable: int = 0
    saturated: bool = False
    oldest_age: float = 0.0
    claims: collections.Counter[int] = field(default_factory=collections.Counter)  # claim attempts per org
    launched: int = 0
    retried: int = 0
    failed: int = 0
    throttled_orgs: set[int] = field(default_factory=set)
    busy_orgs: set[int] = field(default_factory=set)  # another dispatcher held them
    released: int = 0
    ended: int = 0
    seconds: float = 0.0
    note: str = ""

    def summary(self) -> str:
        if self.note:
            return f"dispatch: {self.note}"
        return (
            f"dispatch: candidates={self.candidates} servable={self.servable} claims={sum(self.claims.values())} "
            f"launched={self.launched} retried={self.retried} failed={self.failed} "
            f"throttled_orgs={len(self.throttled_orgs)} released={self.released} ended={self.ended} "
            f"oldest_age={self.oldest_age:.1f}s saturated={self.saturated} in {self.seconds * 1000:.1f} ms"
        )


class Dispatcher:
    """The dispatcher's state between ticks: deferred launches, a rate-limit pause, the GitHub client."""

    def __init__(self, *, batch_size: int | None = None) -> None:
        self.batch_size = batch_size or conf.get().dispatch_batch_size
        self.github = workflows.GitHub()
        self._deferred: dict[uuid.UUID, Deferred] = {}
        self._paused_until: datetime | None = None
        self._warned_unconfigured = False

    # ------------------------------------------------------------ one tick

    def tick(self, now: datetime | None = None) -> TickResult:
        """One tick as of ``now`` (the module docstring's steps 1-5); answers what it did."""
        now = now or timezone.now()
        result = TickResult(now=now)
        started = time.perf_counter()
        if not self.github.configured:
            result.note = "GitHub is not configured (GANTRY_GITHUB_TOKEN or GANTRY_GITHUB_APP_ID, GANTRY_PUBLIC_URL)"
            if not self._warned_unconfigured:
                log.warning(result.note, extra={"event": "dispatch.unconfigured"})
                self._warned_unconfigured = True
            return result
        launches: collections.Counter[str] = collections.Counter()
        with throttle.tallied() as claim_outcomes:
            self._retry_due(now, result, launches)
            servable = self._dispatch(now, result, launches)
            result.released = workflows.release_pass(self.github, now=now)
            workflows.cancel_overdue_pass(self.github, now=now)
            result.ended = workflows.reconcile_pass(self.github, now=now)
        result.servable = len(servable)
        result.saturated = len(servable) >= self.batch_size
        if servable:
            oldest = min(c.first_pending_at for c in servable)
            result.oldest_age = max(0.0, (now - oldest).total_seconds())
        result.seconds = time.perf_counter() - started
        metrics.record_dispatch_tick(
            saturated=result.saturated, oldest_age=result.oldest_age, seconds=result.seconds,
            claims=claim_outcomes, launches=launches,
        )  # fmt: skip
        if result.launched or result.failed or result.throttled_orgs or result.released or result.ended:
            log.info(result.summary(), extra={"event": "dispatch.tick", "now": now.isoformat()})
        return result

    def _dispatch(
        self, now: datetime, result: TickResult, launches: collections.Counter[str]
    ) -> list[candidates.Candidate]:
        """Claim and launch for this tick's candidates; answers the candidates it could serve."""
        batch = candidates.list_candidates(now=now, limit=self.batch_size)
        result.candidates = len(batch)
        if self._paused(now):
            return batch  # rate limited: claim nothing that could not be dispatched
        groups = RunnerGroup.objects.in_bulk({g for c in batch for g in c.group_ids})
        room: dict[int, int] = {}  # the orgs this tick holds, and what each may still have dispatched
        exhausted: set[int] = set()  # groups that answered an empty claim this tick
        try:
            for cand in batch:
                org = cand.organization_id
                if org in result.throttled_orgs or org in result.busy_orgs:
                    continue
                if org not in room:
                    if not candidates.try_lock_org(org):
                        result.busy_orgs.add(org)
                        continue
                    room[org] = candidates.org_in_flight(org).room
                group = next((groups[g] for g in cand.group_ids if g in groups and g not in exhausted), None)
                if room[org] <= 0 or group is None or self._paused(now):
                    continue
                result.claims[org] += 1
                try:
                    got = claim(group=group, now=now, raise_throttled=True)
                except Throttled:
                    result.throttled_orgs.add(org)  # stamped by the claim; the candidate query skips it next tick
                    continue
                if got is None:
                    exhausted.add(group.id)
                    continue
                room[org] -= 1
                self._launch(group, got, now, attempts=1, result=result, launches=launches)
        finally:
            for org in room:
                candidates.unlock_org(org)
        return [c for c in batch if c.organization_id not in result.throttled_orgs]

    def _paused(self, now: datetime) -> bool:
        return self._paused_until is not None and now < self._paused_until

    # ------------------------------------------------------------ launching

    def _launch(
        self,
        group: RunnerGroup,
        got: Claim,
        now: datetime,
        *,
        attempts: int,
        result: TickResult,
        launches: collections.Counter[str],
    ) -> None:
        assignment = Assignment(
            server=self.github.public_url, run_id=str(got.run_id), runner_id=str(got.runner_id),
            runner_token="", assigned_expires_at=got.assigned_expires_at.isoformat(), group_id=str(group.id),
        )  # fmt: skip
        try:
            handle = self.github.launcher(group).launch(assignment)
        except LaunchError as exc:
            self._refused(group, got, now, exc, attempts=attempts, result=result, launches=launches)
            return
        self._deferred.pop(got.runner_id, None)
        meta = handle.meta
        recorded = services.github_runner_dispatched(
            runner_id=got.runner_id, workflow_path=str(meta["workflow_path"]),
            workflow_run_id=meta.get("workflow_run_id"), workflow_run_url=str(meta.get("html_url") or ""),
            correlation=str(meta.get("correlation") or ""), now=now,
        )  # fmt: skip
        result.launched += 1
        launches["launched"] += 1
        log.info(
            "dispatched workflow run %s for run %s", meta.get("workflow_run_id"), got.run_id,
            extra={"event": "dispatch.launched", "run_id": str(got.run_id), "runner_id": str(got.runner_id),
                   "runner_group_id": group.id, "workflow_run_id": meta.get("workflow_run_id"),
                   "attempts": attempts},
        )  # fmt: skip
        if not recorded:
            # The stub went while GitHub answered: nothing will accept for this workflow run.
            workflows.cancel_quietly(self.github, group, meta.get("workflow_run_id"))

    def _refused(
        self,
        group: RunnerGroup,
        got: Claim,
        now: datetime,
        exc: LaunchError,
        *,
        attempts: int,
        result: TickResult,
        launches: collections.Counter[str],
    ) -> None:
        wait = exc.retry_after if exc.retry_after is not None else min(RETRY_CAP, RETRY_BASE**attempts)
        not_before = now + timedelta(seconds=wait)
        if exc.retry_after is not None and exc.retry_after > 0:
            # GitHub named a time (a rate limit, or a 503's Retry-After): no new claims before it.
            self._paused_until = max(self._paused_until or not_before, not_before)
        if not exc.permanent and not_before + BOOT_MARGIN < got.assigned_expires_at:
            self._deferred[got.runner_id] = Deferred(got, group.id, group.organization_id, attempts, not_before,
                                                     exc.message)  # fmt: skip
            result.retried += 1
            launches["retried"] += 1
            log.warning(
                "workflow dispatch refused for now, trying again in %.0fs: %s", wait, exc.message,
                extra={"event": "dispatch.retry", "run_id": str(got.run_id), "attempts": attempts},
            )  # fmt: skip
            return
        self._deferred.pop(got.runner_id, None)
        error = exc.message if exc.permanent else f"{exc.message} (gave up after {attempts} attempts)"
        result.failed += 1
        launches["failed"] += 1
        log.warning(
            "workflow dispatch failed: %s", error,
            extra={"event": "dispatch.failed", "run_id": str(got.run_id), "runner_group_id": group.id},
        )  # fmt: skip
        try:
            services.dispatch_failed(group=group, run_id=got.run_id, runner_id=got.runner_id, error=error, now=now)
        except GantryError:
            # The run moved meanwhile (cancelled, skipped): only the stub is left to remove.
            services.github_runner_release(runner_id=got.runner_id, now=now)

    def _retry_due(self, now: datetime, result: TickResult, launches: collections.Counter[str]) -> None:
        if self._paused(now):
            return
        for runner_id, deferred in sorted(self._deferred.items(), key=lambda kv: kv[1].not_before):
            if deferred.not_before > now or self._paused(now):
                continue
            got = deferred.claim
            still = Run.objects.filter(id=got.run_id, assigned_runner_id=runner_id, status=RunStatus.ASSIGNED).exists()
            group = RunnerGroup.objects.filter(id=deferred.group_id).first()
            if not still or group is None:
                # Cancelled, skipped or timed out while we waited: nothing to dispatch.
                self._deferred.pop(runner_id, None)
                services.github_runner_release(runner_id=runner_id, now=now)
                continue
            self._launch(group, got, now, attempts=deferred.attempts + 1, result=result, launches=launches)

    @property
    def deferred(self) -> int:
        """Launches waiting to be tried again."""
        return len(self._deferred)

    def next_retry_in(self, now: datetime) -> float | None:
        if not self._deferred:
            return None
        due = min(d.not_before for d in self._deferred.values())
        return max(0.0, (due - now).total_seconds())

    # ------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, *, seconds: float | None = None) -> None:
        """Tick until ``stop`` is set (or ``seconds`` pass): woken by the NOTIFY that wakes long polls,
        with a tick every ``GANTRY_DISPATCH_INTERVAL`` seconds as the backstop for a lost notification."""
        interval = float(conf.get().dispatch_interval)
        until = time.monotonic() + seconds if seconds is not None else None
        listener = longpoll.listener()
        failures = 0
        while not stop.is_set() and (until is None or time.monotonic() < until):
            seen = listener.any_generation()
            began = time.monotonic()
            try:
                self.tick()
                failures = 0
            except Exception:
                failures += 1
                log.exception("dispatcher tick failed", extra={"event": "dispatch.tick_failed"})
                connection.close()  # a broken connection must not poison the next tick
                stop.wait(min(RETRY_CAP, RETRY_BASE**failures))
                continue
            timeout = interval
            retry_in = self.next_retry_in(timezone.now())
            if retry_in is not None:
                timeout = min(timeout, retry_in)
            if until is not None:
                timeout = min(timeout, max(0.0, until - time.monotonic()))
            listener.wait_any(seen, timeout, stop)
            # Coalesce a burst of notifications into one tick.
            stop.wait(max(0.0, MIN_GAP - (time.monotonic() - began)))


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM or SIGINT: finish the current tick (its launches included), then return from ``run``."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()
        longpoll.wake_listener()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
