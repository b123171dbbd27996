"""Builders for the reaper tests: runs driven through the real claim and services, at explicit times."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from gantry import conf
from gantry.core import services
from gantry.core.models import Deployment, Run, RunEvent, Runner, RunnerGroup, RunStatus, Stack
from gantry.dispatch.claim import Claim, claim
from tests.core.drive import T0, at, deploy, event_kinds, reload

__all__ = ["T0", "at", "deploy", "event_kinds", "reload"]


def seconds(name: str) -> int:
    """A knob of ``gantry.conf`` in seconds: ``assignment_ttl``, ``stub_cutoff``, …"""
    value: int = getattr(conf.get(), name)
    return value


def after(base: datetime, knob: str, delta: float = 0) -> datetime:
    """``base`` plus the knob's duration plus ``delta`` seconds."""
    return base + timedelta(seconds=seconds(knob) + delta)


def claim_at(group: RunnerGroup, now: datetime) -> Claim:
    """A poll's claim at ``now`` (the stub runner is created at ``now`` too)."""
    claimed = claim(group=group, now=now)
    assert claimed is not None, "nothing claimable"
    return claimed


def accepted(stack: Stack, group: RunnerGroup, now: datetime, **metadata: Any) -> tuple[Run, uuid.UUID]:
    """A run claimed at ``now``, readied (with ``metadata``) and accepted a second later: (run, runner id)."""
    deploy(stack, now=now)
    c = claim_at(group, now)
    services.runner_ready(runner_id=c.runner_id, metadata=metadata, now=now + timedelta(seconds=1))
    run, _ = services.run_accept(run_id=c.run_id, runner_id=c.runner_id, now=now + timedelta(seconds=1))
    return run, c.runner_id


def stuck_in_requested_cancellation(run: Run) -> None:
    """Put a never-started run in requested_cancellation, as old code could; no service does that now."""
    with connection.cursor() as cur:
        cur.execute("UPDATE run SET status = 'requested_cancellation' WHERE id = %s AND started_at IS NULL", [run.id])
        assert cur.rowcount == 1


RUN_COLUMNS = ("id", "status", "updated_at", "assigned_runner_id", "assigned_at", "assigned_expires_at", "finished_at")


def world() -> dict[str, Any]:
    """Everything a sweep could change, for "nothing changed" assertions."""
    return {
        "runs": sorted(Run.objects.values_list(*RUN_COLUMNS)),
        "runners": sorted(Runner.objects.values_list("id", "status", "last_seen_at")),
        "deployments": sorted(Deployment.objects.values_list("id", "status", "updated_at")),
        "events": RunEvent.objects.count(),
    }


def status(run: Run) -> str:
    return reload(run).status


def log_manifest(run: Run) -> dict[str, Any] | None:
    """The run's log manifest: set once its log is in storage (by /done, or by a reaper's flush)."""
    manifest: dict[str, Any] | None = Run.objects.values_list("log_manifest", flat=True).get(id=run.id)
    return manifest


def claimable(run: Run) -> bool:
    """Whether a poll could take ``run`` now: pending and bound to no live runner."""
    row = reload(run)
    return row.status == RunStatus.PENDING and row.assigned_runner_id is None


def heartbeat(*, runner_id: uuid.UUID, run_id: uuid.UUID, now: datetime) -> str | None:
    """The runner's /status at ``now``: its liveness refreshed; the run's status."""
    group = Runner.objects.get(id=runner_id).runner_group_id
    found, status = services.runner_status(runner_id=runner_id, runner_group_id=group, run_id=run_id, bound=True,
                                           now=now)  # fmt: skip
    assert found
    return status
