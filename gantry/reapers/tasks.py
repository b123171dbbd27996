"""Celery tasks: one per reaper, each run by beat every ``GANTRY_REAPER_INTERVAL`` seconds.

The schedule is ``CELERY_BEAT_SCHEDULE`` in settings. Each entry expires after
one period, so a worker that fell behind drops stale ticks instead of running
a pile of them back to back; sweeps are idempotent and safe to overlap, so a
late or doubled tick does no harm either way.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from gantry.reapers import reapers


def _run(name: str) -> dict[str, int]:
    # The instant is taken when the task runs, not when beat sent it.
    return dict(reapers.REAPERS[name](now=timezone.now()).counts)


@shared_task(name="gantry.reapers.expired_assignments", ignore_result=True)
def expired_assignments() -> dict[str, int]:
    return _run("expired_assignments")


@shared_task(name="gantry.reapers.startup_deadline", ignore_result=True)
def startup_deadline() -> dict[str, int]:
    return _run("startup_deadline")


@shared_task(name="gantry.reapers.inactive_runners", ignore_result=True)
def inactive_runners() -> dict[str, int]:
    return _run("inactive_runners")


@shared_task(name="gantry.reapers.cancellation_backstop", ignore_result=True)
def cancellation_backstop() -> dict[str, int]:
    return _run("cancellation_backstop")


@shared_task(name="gantry.reapers.retention", ignore_result=True)
def retention() -> dict[str, int]:
    return _run("retention")
