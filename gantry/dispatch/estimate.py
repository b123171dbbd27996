"""A waiting run's expected start (docs/queue.md): from its groups' recent hand-out rate and free slots.

The rule, written once here (gantry.dispatch.queue calls it for every run with
a position):

- a group's **rate** is the runs it handed out (claims, recorded by
  ``gantry.metrics.record_claim`` in 10-second buckets) over the last
  ``GANTRY_QUEUE_RATE_WINDOW`` seconds, divided by that window (to the
  bucket: from the start of the bucket the window begins in). A group that
  handed out nothing in the window, or whose count Redis cannot answer, has
  **no basis**: the past says nothing about when it takes the next run, and a
  guess is not presented as an estimate;
- for each group G in whose order the run stands at rank k_G, the run starts
  once G has handed out the runs ahead of it and a slot is free for it: the
  first ``free_slots_G`` go at once, each later one at G's rate, so
  est_G = max(0, k_G - free_slots_G) / rate_G;
- the run's estimate is the smallest est_G over its groups with a basis (the
  first group to reach it takes it), in whole seconds; None when no group has
  a basis, and None for a run with no position.

It assumes the group keeps handing out at its recent rate and that nothing of
higher priority arrives meanwhile: an estimate, not a promise.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from gantry import conf, metrics


def rates(group_ids: Iterable[int], *, now: datetime) -> dict[int, float]:
    """Hand-outs per second of each group over the window ending at ``now``: one Redis round trip.

    A group with no basis (nothing handed out in the window, or Redis cannot answer) is left out.
    """
    window = conf.get().queue_rate_window
    until = now.timestamp()
    since = until - window
    counts = metrics.handouts(group_ids, since=since, until=until)
    if counts is None:
        return {}
    # The counts are whole buckets, from the start of the one holding ``since``: per second of what they cover
    # (dividing by the window alone would count up to a bucket's hand-outs too many).
    covered = until - since // metrics.HANDOUT_BUCKET * metrics.HANDOUT_BUCKET
    return {group_id: n / covered for group_id, n in counts.items() if n > 0}


def expected_start_seconds(places: Iterable[tuple[int, int, float | None]]) -> int | None:
    """Seconds until the run is expected to start, from its ``(rank, free_slots, rate)`` in each group that
    could take it (``rate`` None: no basis); None when no group has a basis."""
    estimates = [max(0, rank - free) / rate for rank, free, rate in places if rate]
    return round(min(estimates)) if estimates else None
