"""Gantry's Prometheus metrics, served at ``/metrics`` (``gantry.web.ops``).

Reaper and backend-dispatcher figures are global, not per process. The reapers run in Celery worker
processes (or ``manage.py reap``), never in the web process that answers
``/metrics``, so an in-process counter would be invisible to the scrape. Each
sweep therefore adds its figures to one Redis hash, and a collector registered
here reads that hash at scrape time: every web process reports the same
totals, summed over every worker that ever swept. The hash is keyed by the
database name, so installations (and test databases) sharing one Redis keep
apart. Recording and reading both fail open: a Redis outage loses figures,
never a sweep or a scrape.

Run timings (pending → claimed, claimed → accepted, pending → finished) and
finished runs by outcome are kept the same way, in a second hash, recorded
after the transition commits (buffered in the process for up to a second:
:func:`record_runs`); their org label is resolved to the slug at
scrape time. They and the queue's database-derived gauges
(``gantry.dispatch.demand``) live on :data:`SCRAPE_REGISTRY`, which only
``/metrics`` reads, so sampling the default registry never touches Redis or
the database for them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import redis
from django.db import connections
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gantry import conf
from gantry import redis as gantry_redis
from gantry.dispatch import throttle
from gantry.ticker import Ticker

log = logging.getLogger("gantry.metrics")

T = TypeVar("T")


def cumulative_buckets(values: Mapping[str, str], prefix: str, bounds: Sequence[float]) -> list[tuple[str, float]]:
    """A histogram's cumulative (le, count) pairs from per-bucket counts stored at ``prefix`` + bucket index."""
    total, buckets = 0.0, []
    for i, le in enumerate((*bounds, math.inf)):
        total += float(values.get(f"{prefix}{i}", 0))
        buckets.append(("+Inf" if le == math.inf else str(le), total))
    return buckets


def bucket_of(seconds: float, bounds: Sequence[float]) -> int:
    """The index of the first histogram bucket holding ``seconds`` (``len(bounds)``: the +Inf bucket)."""
    return next((i for i, le in enumerate(bounds) if seconds <= le), len(bounds))


# Every reaper and the outcomes it counts, so each series exists (at 0) before its first event.
REAPER_OUTCOMES: dict[str, tuple[str, ...]] = {
    "expired_assignments": ("reset", "skipped", "error"),
    "startup_deadline": ("timed_out", "skipped", "error"),
    "inactive_runners": ("stub_deleted", "runner_lost", "runner_deleted", "flush_failed", "skipped", "error"),
    "cancellation_backstop": ("cancelled", "skipped", "error"),
    # Retention (gantry.reapers.retention): runs removed, with their events; run logs whose
    # storage objects and Redis records were removed; purges that failed and wait for the next tick;
    # webhook deliveries removed (with their run, or finished past retention).
    "retention": ("run_deleted", "event_deleted", "log_purged", "purge_failed", "delivery_deleted", "error"),
    "force_delete": ("runner_deleted", "run_failed"),
}
# Sweep durations: a sweep with nothing due takes a millisecond or two; a full
# bounded sweep (thousands of transitions) tens of seconds.
SWEEP_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _read_hash(key: str, what: str) -> dict[str, str] | None:
    """One figures hash from Redis as text, or None (logged) when Redis cannot answer: a scrape fails open."""
    try:
        raw = gantry_redis.client().hgetall(key)
    except redis.RedisError as exc:
        log.warning("%s unavailable: %s", what, exc, extra={"event": "metrics.read_failed"})
        return None
    return {_text(k): _text(v) for k, v in raw.items()}


def _key() -> str:
    return f"gantry:metrics:{connections['default'].settings_dict['NAME']}:reapers"


def record_reaped(reaper: str, counts: Mapping[str, int], seconds: float | None = None) -> None:
    """Add one sweep's (or one action's) counts, and the sweep's duration when given."""
    fields: dict[str, int] = {f"reaped|{reaper}|{outcome}": n for outcome, n in counts.items() if n}
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        for field, n in fields.items():
            pipe.hincrby(_key(), field, n)
        if seconds is not None:
            bucket = bucket_of(seconds, SWEEP_BUCKETS)
            pipe.hincrby(_key(), f"sweeps|{reaper}", 1)
            pipe.hincrbyfloat(_key(), f"seconds|{reaper}", seconds)
            pipe.hincrby(_key(), f"bucket|{reaper}|{bucket}", 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("reaper metrics not recorded: %s", exc, extra={"event": "metrics.record_failed"})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ReaperCollector(Collector):
    """Reads the reaper figures from Redis at scrape time."""

    def describe(self) -> Iterable[Metric]:
        # Without describe() registering would call collect(), reading Redis at import.
        return self._families()

    def collect(self) -> Iterable[Metric]:
        values = _read_hash(_key(), "reaper metrics")
        if values is None:
            return []
        return self._families(values)

    @staticmethod
    def _families(values: Mapping[str, str] | None = None) -> list[Metric]:
        values = values or {}
        reaped = CounterMetricFamily(
            "gantry_reaper_reaped",
            "Runs and runners the reapers (and force-delete) acted on, by outcome; 'skipped' means another "
            "sweep or a request got there first.",
            labels=["reaper", "outcome"],
        )
        for reaper, outcomes in REAPER_OUTCOMES.items():
            for outcome in outcomes:
                reaped.add_metric([reaper, outcome], float(values.get(f"reaped|{reaper}|{outcome}", 0)))
        duration = HistogramMetricFamily(
            "gantry_reaper_sweep_duration_seconds", "Duration of one reaper sweep.", labels=["reaper"]
        )
        for reaper in REAPER_OUTCOMES:
            if reaper == "force_delete":
                continue  # an operator action, not a sweep
            buckets = cumulative_buckets(values, f"bucket|{reaper}|", SWEEP_BUCKETS)
            duration.add_metric([reaper], buckets, sum_value=float(values.get(f"seconds|{reaper}", 0)))
        return [reaped, duration]


# ---------------------------------------------------------------- the backend dispatcher
#
# The same arrangement for the same reason: the dispatcher runs in a Celery
# worker or ``manage.py dispatcher``, never in the web process. Each tick adds
# its figures to one Redis hash; the oldest-dispatchable age is the last
# tick's (a gauge). The dispatcher's claims are counted there too
# (throttle.tallied), and ``gantry_org_run_dispatch_total`` is exported here
# as this process's claims (the poll's) plus the dispatchers'.

# Launch outcomes: the workflow was dispatched, a transient refusal will be
# tried again, a definitive one (or the lease running out) failed the run.
LAUNCH_OUTCOMES = ("launched", "retried", "failed")
# A tick is a query and a few claims; GitHub calls (a second or so each) make the long ones.
TICK_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _dispatch_key() -> str:
    return f"gantry:metrics:{connections['default'].settings_dict['NAME']}:dispatch"


def record_dispatch_tick(
    *,
    saturated: bool,
    oldest_age: float,
    seconds: float,
    claims: Mapping[str, int],
    launches: Mapping[str, int],
) -> None:
    """Add one dispatcher tick's figures (fails open: a Redis outage loses figures, never a tick)."""
    bucket = bucket_of(seconds, TICK_BUCKETS)
    key = _dispatch_key()
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        pipe.hincrby(key, "ticks", 1)
        pipe.hincrbyfloat(key, "seconds", seconds)
        pipe.hincrby(key, f"bucket|{bucket}", 1)
        if saturated:
            pipe.hincrby(key, "saturated", 1)
        pipe.hset(key, "oldest_age", repr(float(oldest_age)))
        for outcome, n in claims.items():
            if n:
                pipe.hincrby(key, f"claims|{outcome}", n)
        for outcome, n in launches.items():
            if n:
                pipe.hincrby(key, f"launches|{outcome}", n)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("dispatcher metrics not recorded: %s", exc, extra={"event": "metrics.record_failed"})


class DispatchCollector(Collector):
    """The backend dispatcher's figures (from Redis) and the claims' dispatch outcomes (this process + Redis)."""

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        # Every series at 0 when Redis cannot answer (the dispatcher's families are always listed).
        return self._families(_read_hash(_dispatch_key(), "dispatcher metrics") or {})

    @staticmethod
    def _families(values: Mapping[str, str]) -> list[Metric]:
        local = {
            sample.labels["outcome"]: sample.value
            for metric in throttle.DISPATCH_TOTAL.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        claims = CounterMetricFamily(
            "gantry_org_run_dispatch",
            "Claims that won a run, by what the dispatch budget said: dispatched, limited (rolled back), "
            "failed_open (Redis unavailable, dispatched anyway). Polls and the backend dispatcher alike.",
            labels=["outcome"],
        )
        for claim_outcome in throttle.OUTCOMES:
            claims.add_metric(
                [claim_outcome], local.get(claim_outcome, 0.0) + float(values.get(f"claims|{claim_outcome}", 0))
            )
        saturated = CounterMetricFamily(
            "gantry_dispatch_batch_saturated",
            "Backend dispatcher ticks whose candidate batch was full of runs it could serve (throttled orgs "
            "dropped): the dispatcher, not a budget, is the bottleneck.",
        )
        saturated.add_metric([], float(values.get("saturated", 0)))
        oldest = GaugeMetricFamily(
            "gantry_dispatch_oldest_dispatchable_age_seconds",
            "Age of the oldest run the last tick could serve (orgs the throttle refused during the tick "
            "dropped); 0 when there was none. The dispatch-latency SLO.",
        )
        oldest.add_metric([], float(values.get("oldest_age", 0)))
        launches = CounterMetricFamily(
            "gantry_dispatch_launches",
            "Workflow dispatches by outcome: launched, retried (transient refusal), failed (run failed).",
            labels=["outcome"],
        )
        for outcome in LAUNCH_OUTCOMES:
            launches.add_metric([outcome], float(values.get(f"launches|{outcome}", 0)))
        duration = HistogramMetricFamily(
            "gantry_dispatch_tick_duration_seconds", "Duration of one backend dispatcher tick."
        )
        buckets = cumulative_buckets(values, "bucket|", TICK_BUCKETS)
        duration.add_metric([], buckets, sum_value=float(values.get("seconds", 0)))
        return [claims, saturated, oldest, launches, duration]


_collector = ReaperCollector()
_dispatch_collector = DispatchCollector()
_registered = False


def register() -> None:
    """Register the collectors with the default registry, once per process (the reapers app's ready())."""
    global _registered
    if not _registered:
        REGISTRY.register(_collector)
        REGISTRY.register(_dispatch_collector)
        _registered = True


# ---------------------------------------------------------------- run timings

# Read by /metrics only (besides the default registry): collectors that cost a query.
SCRAPE_REGISTRY = CollectorRegistry(auto_describe=False)

RUN_TIMINGS: dict[str, str] = {
    "pending_to_claimed": "From the run first becoming pending to a poll claiming it.",
    "claimed_to_accepted": "From the claim to the runner's accept (the runner's start-up).",
    "pending_to_finished": "From the run first becoming pending to its end, any outcome.",
}
# Waits run from a second to hours (a throttled org, a full group).
RUN_BUCKETS: tuple[float, ...] = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# A phase the runner and the server make (start-up, first output): tens of milliseconds to a minute.
PHASE_BUCKETS: tuple[float, ...] = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# The histograms by runner group: name -> (metric, help, buckets, labels after org and runner_group).
BY_GROUP: dict[str, tuple[str, str, tuple[float, ...], tuple[str, ...]]] = {
    "wait": (
        "gantry_run_wait_seconds",
        "From the run first becoming pending to a poll claiming it, by runner group and the run's own priority.",
        RUN_BUCKETS,
        ("priority",),
    ),
    "start": (
        "gantry_run_start_seconds",
        "From the claim a runner accepted to its accept (the runner's start-up), by runner group.",
        PHASE_BUCKETS,
        (),
    ),
    "firstout": (
        "gantry_run_first_output_seconds",
        "From the accept to the run's first output reaching Gantry, by runner group; observed when the run finishes.",
        PHASE_BUCKETS,
        (),
    ),
}
FINISHED_OUTCOMES = ("succeeded", "failure", "cancelled", "discarded", "startup_timeout")


def _runs_key() -> str:
    return f"gantry:metrics:{connections['default'].settings_dict['NAME']}:runs"


def record_run(*, organization_id: int, timings: Mapping[str, float], finished: str | None = None) -> None:
    """Add one transition's figures: seconds per timing name, and a finished run's outcome. Fails open."""
    record_runs([(organization_id, timings, finished)])


def record_runs(runs: Iterable[tuple[int, Mapping[str, float], str | None]]) -> None:
    """``record_run`` for many runs (organization id, timings, finished outcome); fails open.

    Added to this process's buffer, which one pipeline writes to Redis at most
    :data:`FLUSH_SECONDS` later (a background thread), at a scrape of this
    process, and at exit: the runner routes record a figure on every claim,
    accept and finish, and a Redis round trip on each would cost those calls
    more than their own statements' client side. Equal increments are summed first, so
    a flush is one ``HINCRBY`` per (timing, org, bucket) however many runs
    moved. A process killed outright loses at most its last second of
    figures, as an in-process counter would lose all of them.
    """
    counts: Counter[str] = Counter()
    sums: defaultdict[str, float] = defaultdict(float)
    for organization_id, timings, finished in runs:
        for name, seconds in timings.items():
            seconds = max(0.0, seconds)
            bucket = bucket_of(seconds, RUN_BUCKETS)
            counts[f"bucket|{name}|{organization_id}|{bucket}"] += 1
            sums[f"sum|{name}|{organization_id}"] += seconds
        if finished is not None:
            counts[f"finished|{organization_id}|{finished}"] += 1
    if not counts and not sums:
        return
    key = _runs_key()
    with _buffer_lock:
        buffered = _buffer.setdefault(key, (Counter(), defaultdict(float)))
        buffered[0].update(counts)
        for field, total in sums.items():
            buffered[1][field] += total
        _flusher.start()


# ---------------------------------------------------------------- claims: waits by priority, and hand-outs
#
# Each claim adds its wait (first pending -> claimed) to a histogram by group
# and priority (``gantry_run_wait_seconds``: an operator alerts on a starving
# class), and one hand-out to its group's count in a HANDOUT_BUCKET-second
# bucket, a small Redis hash per bucket that expires once no read can ask for
# it. The queue reads the buckets for a group's recent hand-out rate
# (gantry.dispatch.estimate); both ride the same buffer as the run timings.

HANDOUT_BUCKET = 10


def _handouts_key(bucket: int) -> str:
    return f"gantry:handouts:{connections['default'].settings_dict['NAME']}:{bucket}"


def record_claim(*, organization_id: int, group_id: int, priority: str, waited: float, at: float) -> None:
    """One claim's figures (after it committed): its wait by org, and by group and priority, and a hand-out
    of the group at ``at`` (epoch seconds). Fails open."""
    waited = max(0.0, waited)
    record_run(organization_id=organization_id, timings={"pending_to_claimed": waited})
    with _buffer_lock:
        _add_by_group("wait", f"{group_id}|{priority}", waited)
        _buffer.setdefault(_handouts_key(int(at // HANDOUT_BUCKET)), (Counter(), defaultdict(float)))[0][
            str(group_id)
        ] += 1
        _flusher.start()


def _add_by_group(name: str, labels: str, seconds: float) -> None:
    """One observation of the histogram ``name`` by group (``labels``: the group id, then any other label,
    ``|``-joined) into the buffer; the caller holds ``_buffer_lock``. Its collector: :meth:`RunCollector._by_group`."""
    seconds = max(0.0, seconds)
    buckets = BY_GROUP[name][2]
    bucket = bucket_of(seconds, buckets)
    counts, sums = _buffer.setdefault(_runs_key(), (Counter(), defaultdict(float)))
    counts[f"{name}|{labels}|{bucket}"] += 1
    sums[f"{name}sum|{labels}"] += seconds


def record_phase(
    *, organization_id: int, group_id: int | None, start: float | None = None, first_output: float | None = None
) -> None:
    """A run's phases, after the transition committed: its start-up (claim -> accept; also the org's
    ``claimed_to_accepted``) and its first output (accept -> first output), by runner group. Fails open."""
    if start is not None:
        record_run(organization_id=organization_id, timings={"claimed_to_accepted": start})
    if group_id is None:
        return
    with _buffer_lock:
        if start is not None:
            _add_by_group("start", str(group_id), start)
        if first_output is not None:
            _add_by_group("firstout", str(group_id), first_output)
        _flusher.start()


def handouts(group_ids: Iterable[int], *, since: float, until: float) -> dict[int, int] | None:
    """Hand-outs per group in the buckets from the one holding ``since`` to the one holding ``until``
    (epoch seconds): one Redis round trip. None when Redis cannot answer (no basis, not zero)."""
    ids = [str(g) for g in group_ids]
    if not ids:
        return {}
    flush_runs()  # this process's own latest claims, at least
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        for bucket in range(int(since // HANDOUT_BUCKET), int(until // HANDOUT_BUCKET) + 1):
            pipe.hmget(_handouts_key(bucket), ids)
        answers = pipe.execute()
    except redis.RedisError as exc:
        log.warning("hand-out counts not read: %s", exc, extra={"event": "metrics.read_failed"})
        return None
    totals = dict.fromkeys((int(g) for g in ids), 0)
    for values in answers:
        for group, value in zip(ids, values, strict=True):
            if value is not None:
                totals[int(group)] += int(value)
    return totals


# Seconds a recorded run figure may wait in the process before it reaches Redis.
FLUSH_SECONDS = 1.0
# Redis hash key -> (counts, sums) not written yet.
_buffer: dict[str, tuple[Counter[str], defaultdict[str, float]]] = {}
_buffer_lock = threading.Lock()


def flush_runs() -> None:
    """Write the buffered run figures to Redis now, one pipeline; fails open (a Redis error drops them, logged)."""
    with _buffer_lock:
        pending = list(_buffer.items())
        _buffer.clear()
    if not pending:
        return
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        for key, (counts, sums) in pending:
            for field, n in counts.items():
                pipe.hincrby(key, field, n)
            for field, total in sums.items():
                pipe.hincrbyfloat(key, field, total)
            if key.startswith("gantry:handouts:"):
                # Kept as long as a read's window may reach back to it.
                pipe.expire(key, conf.get().queue_rate_window + 2 * HANDOUT_BUCKET)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("run metrics not recorded: %s", exc, extra={"event": "metrics.record_failed"})


_flusher = Ticker("gantry-metrics-flush", FLUSH_SECONDS, flush_runs)


class ScrapeMemo(Generic[T]):
    """A scrape-time value (a query's answer) kept for ``GANTRY_METRICS_CACHE_SECONDS`` in this process.

    Prometheus servers in an HA pair, a second dashboard, a human with curl: every
    scrape would otherwise run the queue's statements again. The lock makes
    scrapes that arrive together wait for the one computing and share its
    answer; a failure is not kept (the next scrape tries again).
    """

    _all: list[ScrapeMemo[Any]] = []

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute = compute
        self._lock = threading.Lock()
        self._value: T | None = None
        self._at: float | None = None
        ScrapeMemo._all.append(self)

    def get(self) -> T:
        ttl = conf.get().metrics_cache_seconds
        with self._lock:
            now = time.monotonic()
            if self._value is None or self._at is None or now - self._at >= ttl:
                self._value = self._compute()
                self._at = now
            return self._value

    @classmethod
    def clear_all(cls) -> None:
        """Forget every kept value: the next scrape computes afresh."""
        for memo in cls._all:
            with memo._lock:
                memo._at = None
                memo._value = None


class CachedCollector(Collector):
    """``inner``'s families, computed at most once per ``GANTRY_METRICS_CACHE_SECONDS`` (:class:`ScrapeMemo`)."""

    def __init__(self, inner: Collector) -> None:
        self._memo: ScrapeMemo[list[Metric]] = ScrapeMemo(lambda: list(inner.collect()))

    def collect(self) -> Iterable[Metric]:
        return list(self._memo.get())

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not query the database


def _org_slugs() -> dict[str, str]:
    from gantry.core.models import Organization  # the app registry is ready by the first scrape

    return {str(i): s for i, s in Organization.objects.values_list("id", "slug")}


# One statement for every org, kept like the queue's gauges.
_slugs = ScrapeMemo(_org_slugs)


def _group_names() -> dict[str, tuple[str, str]]:
    from gantry.core.models import RunnerGroup

    rows = RunnerGroup.objects.values_list("id", "organization__slug", "name")
    return {str(i): (slug, name) for i, slug, name in rows}


# Group id -> (org slug, group name), for the wait histogram's labels.
_groups = ScrapeMemo(_group_names)


class RunCollector(Collector):
    """Reads the run timings and finished counts from Redis at scrape time, labelled by org slug."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        flush_runs()  # this process's own latest figures, at least
        values = _read_hash(_runs_key(), "run metrics")
        if values is None:
            return []
        slugs = _slugs.get()
        finished = CounterMetricFamily(
            "gantry_runs_finished",
            "Runs that reached a terminal status, by org and outcome.",
            labels=["org", "outcome"],
        )
        for org_id, slug in slugs.items():
            for outcome in FINISHED_OUTCOMES:
                finished.add_metric([slug, outcome], float(values.get(f"finished|{org_id}|{outcome}", 0)))
        families: list[Metric] = [finished]
        for name, doc in RUN_TIMINGS.items():
            hist = HistogramMetricFamily(f"gantry_run_{name}_seconds", doc, labels=["org"])
            for org_id, slug in slugs.items():
                buckets = cumulative_buckets(values, f"bucket|{name}|{org_id}|", RUN_BUCKETS)
                hist.add_metric([slug], buckets, sum_value=float(values.get(f"sum|{name}|{org_id}", 0)))
            families.append(hist)
        families.extend(self._by_group(name, values) for name in BY_GROUP)
        return families

    @staticmethod
    def _by_group(name: str, values: Mapping[str, str]) -> Metric:
        """``BY_GROUP[name]``'s histogram {org, runner_group, ...}: for every group (and labels) observed."""
        metric, doc, bounds, extra = BY_GROUP[name]
        hist = HistogramMetricFamily(metric, doc, labels=["org", "runner_group", *extra])
        prefix = f"{name}sum|"
        seen = sorted({f[len(prefix) :] for f in values if f.startswith(prefix)})
        names = _groups.get() if seen else {}
        for labels in seen:
            group_id, *rest = labels.split("|")
            if group_id not in names:
                continue  # a group deleted since (tests' databases come and go): nothing to name it by
            slug, group_name = names[group_id]
            buckets = cumulative_buckets(values, f"{name}|{labels}|", bounds)
            hist.add_metric([slug, group_name, *rest], buckets, sum_value=float(values.get(f"{prefix}{labels}", 0)))
        return hist


SCRAPE_REGISTRY.register(RunCollector())


# ---------------------------------------------------------------- long-poll claim attempts


def _poll_key() -> str:
    return f"gantry:metrics:{connections['default'].settings_dict['NAME']}:poll"


def record_poll_attempts(counts: Mapping[str, int]) -> None:
    """Add one web process's claim attempts since its last flush (gantry.server.asyncpoll). Fails open."""
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        for kind, n in counts.items():
            if n:
                pipe.hincrby(_poll_key(), kind, n)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("poll metrics not recorded: %s", exc, extra={"event": "metrics.record_failed"})


class PollCollector(Collector):
    """Claim attempts of runner-group polls summed over every web process (flushed about once a second)."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        values = _read_hash(_poll_key(), "poll metrics")
        if values is None:
            return []
        family = CounterMetricFamily(
            "gantry_poll_fleet_claim_attempts",
            "Claim attempts of runner-group polls over all web processes: a poll's first, or one after a wake.",
            labels=["kind"],
        )
        for kind in ("first", "wake"):
            family.add_metric([kind], float(values.get(kind, 0)))
        return [family]


SCRAPE_REGISTRY.register(PollCollector())
