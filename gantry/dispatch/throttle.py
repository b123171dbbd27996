"""The per-org dispatch budget: a token bucket in Redis (docs/design.md §5, "Per-org runs/hour throttle").

Each org has one bucket, a Redis hash ``{tokens, ts}`` under
``gantry:bucket:org:<id>``. It refills at the org's ``runs_per_hour_limit``
tokens per hour up to a burst of that rate * 24 (a day's worth), and a claim
spends one token. A single Lua script does the arithmetic (:data:`_BUCKET_LUA`),
so a check is one round trip and atomic across every web process:

- time is Redis's own ``TIME``, never a web process's clock, so processes with
  skewed clocks share one notion of "now";
- the rate is an argument of every call, not stored: the claim reads it from
  the org row in its own statement, so a new rate applies to the very next
  poll (raised from 1/h to 3600/h, the next token is a second away, not an
  hour). Stored tokens above a lowered burst are clamped on read;
- a bucket written by a consume expires (PEXPIRE) once it would be full
  again, so idle orgs cost no memory. A missing bucket reads as full, which is
  exactly what it would hold by then, and is also why a new org starts with
  its whole burst;
- a peek (the budget API) runs the same arithmetic and writes nothing.

Rate 0 means nothing dispatches (burst 0). That answer needs no Redis, so it
holds even while Redis is down.

Failure policy: the limiter never stops dispatch because of itself. Any Redis
error (refused, timeout, script error) lets the claim through ("fails open"),
counted in ``gantry_throttle_fail_open_total`` and logged as a warning with
``event: throttle.fail_open``. After a connection-level error the limiter
stops asking Redis for :data:`BREAKER_SECONDS` (still failing open), because
the claim calls it while holding its group's row lock: a Redis that times out
would otherwise cost every poll of that group a timeout, one after another.
With ``GANTRY_RATE_LIMIT_ENABLED`` off nothing here talks to Redis.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

import redis
from prometheus_client import Counter
from redis.commands.core import Script

from gantry import conf
from gantry import redis as gantry_redis

log = logging.getLogger("gantry.throttle")

# burst = rate * BURST_HOURS: an org may dispatch a day's budget at once.
BURST_HOURS = 24
KEY_PREFIX = "gantry:bucket:org:"
# How long the limiter leaves Redis alone after a connection error or timeout.
BREAKER_SECONDS = 2.0

DISPATCHED: Final = "dispatched"  # a token was spent (or the limiter is off) and the run went out
LIMITED: Final = "limited"  # the bucket was empty: the claim rolled back
FAILED_OPEN: Final = "failed_open"  # the limiter could not answer; the run went out without a token
Outcome = Literal["dispatched", "limited", "failed_open"]

# dispatched + failed_open = runs handed out; limited is the signal that an
# org's purchased budget, not the dispatcher, holds its queue back. Not in the
# default registry itself: gantry.metrics exports it summed with the backend
# dispatcher's counts, which live in Redis (see record()).
DISPATCH_TOTAL = Counter(
    "gantry_org_run_dispatch",
    "Claims that won a run, by what the dispatch budget said: dispatched, limited (rolled back), "
    "failed_open (Redis unavailable, dispatched anyway).",
    ["outcome"],
    registry=None,
)
OUTCOMES: tuple[Outcome, ...] = (DISPATCHED, LIMITED, FAILED_OPEN)
FAIL_OPEN_TOTAL = Counter(
    "gantry_throttle_fail_open",
    "Dispatches let through without a token because the throttle's Redis could not answer.",
)
for _outcome in (DISPATCHED, LIMITED, FAILED_OPEN):
    DISPATCH_TOTAL.labels(outcome=_outcome)  # export zeros, so rate() works from the first scrape

# KEYS[1]: the bucket. ARGV[1]: rate (tokens per hour), ARGV[2]: burst,
# ARGV[3]: '1' to take a token, '0' to peek (no write of any kind), '2' to
# give one back (a token taken ahead of a claim that found no run; never
# above the burst).
# Answers {allowed, tokens (string: Lua numbers reach the client truncated to
# integers), ms until the next whole token (0: one is there; -1: never)}.
# Times are milliseconds with a fractional part (TIME gives microseconds).
# Redis >= 5 replicates a script's effects, so TIME before a write is allowed.
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local take = ARGV[3] == '1'
local give = ARGV[3] == '2'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tokens = burst
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
if state[1] and state[2] then
  local elapsed = now - tonumber(state[2])
  if elapsed < 0 then elapsed = 0 end  -- a failover to a server whose clock is behind
  -- min(): refill stops at the burst, and tokens stored under a larger burst
  -- (the rate was lowered) are clamped to the new one.
  tokens = math.min(burst, tonumber(state[1]) + elapsed * rate / 3600000)
end
local allowed = 0
if give then
  tokens = math.min(burst, tokens + 1)
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.17g', now))
  redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((burst - tokens) * 3600000 / rate)))
  allowed = 1
elseif tokens >= 1 then
  allowed = 1
  if take then
    tokens = tokens - 1
    redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.17g', now))
    -- Gone once it would be full again: a missing bucket reads as full.
    redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((burst - tokens) * 3600000 / rate)))
  end
end
local wait = 0
if tokens < 1 then
  if rate > 0 then wait = math.ceil((1 - tokens) * 3600000 / rate) else wait = -1 end
end
return {allowed, string.format('%.17g', tokens), wait}
"""

# One Script per client: it remembers the SHA, calls EVALSHA, and on NOSCRIPT
# (a restarted or flushed Redis) loads the script and retries.
_scripts: dict[int, tuple[redis.Redis, Script]] = {}
_scripts_lock = threading.Lock()


def _script(client: redis.Redis) -> Script:
    found = _scripts.get(id(client))
    if found is not None and found[0] is client:
        return found[1]
    with _scripts_lock:
        script = client.register_script(_BUCKET_LUA)
        _scripts[id(client)] = (client, script)
        return script


@dataclass(frozen=True)
class Bucket:
    """What the bucket holds, as of Redis's clock."""

    allowed: bool  # a whole token was there (and, for a take, was spent)
    tokens: float  # tokens left (after the take)
    ms_to_next_token: int | None  # until the next whole token: 0 if one is there, None if never (rate 0)


def burst_for(rate: int) -> int:
    return rate * BURST_HOURS


def key_for(organization_id: int) -> str:
    return f"{KEY_PREFIX}{organization_id}"


_PEEK, _TAKE, _GIVE = 0, 1, 2


def _eval(*, organization_id: int, rate: int, op: int) -> Bucket:
    """One call of the script; raises on any Redis error (callers decide the policy)."""
    if rate <= 0:
        # Rate 0: burst 0, no refill; nothing to ask Redis.
        return Bucket(allowed=False, tokens=0.0, ms_to_next_token=None)
    client = gantry_redis.client()
    answer = _script(client)(keys=[key_for(organization_id)], args=[rate, burst_for(rate), op])
    allowed, tokens, wait = answer
    return Bucket(
        allowed=bool(int(allowed)),
        tokens=float(tokens),
        ms_to_next_token=None if int(wait) < 0 else int(wait),
    )


def take(*, organization_id: int, rate: int) -> Bucket:
    """Spend one token if there is one. Raises on a Redis error."""
    return _eval(organization_id=organization_id, rate=rate, op=_TAKE)


def peek(*, organization_id: int, rate: int) -> Bucket:
    """The bucket as it stands; writes nothing. Raises on a Redis error."""
    return _eval(organization_id=organization_id, rate=rate, op=_PEEK)


def give_back(*, organization_id: int, rate: int) -> Bucket:
    """Return one token (up to the burst). Raises on a Redis error."""
    return _eval(organization_id=organization_id, rate=rate, op=_GIVE)


# ---------------------------------------------------------------- the claim's policy

# The client for which Redis is being left alone, and until when (monotonic).
_breaker: tuple[redis.Redis, float] | None = None


def _breaker_open(client: redis.Redis) -> bool:
    b = _breaker
    return b is not None and b[0] is client and time.monotonic() < b[1]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    # Set when limited: when the next token is due (None: never, rate 0).
    ms_to_next_token: int | None = None
    # Tokens left after a spent one, when Redis said (the claim's take-ahead judges by it).
    tokens: float | None = None


def consume(*, organization_id: int, rate: int) -> Decision:
    """The claim's question: may this org dispatch one more run now? Never raises."""
    global _breaker
    if not conf.get().rate_limit_enabled:
        return Decision(DISPATCHED)
    if rate <= 0:
        return Decision(LIMITED, ms_to_next_token=None)
    try:
        client = gantry_redis.client()
    except ValueError as exc:  # a malformed REDIS_URL
        return _fail_open(organization_id, exc)
    if _breaker_open(client):
        # Counted, not logged: the warning went out when the breaker opened.
        FAIL_OPEN_TOTAL.inc()
        return Decision(FAILED_OPEN)
    try:
        bucket = take(organization_id=organization_id, rate=rate)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        _breaker = (client, time.monotonic() + BREAKER_SECONDS)
        return _fail_open(organization_id, exc)
    except (redis.RedisError, OSError, ValueError, TypeError) as exc:
        # A script error or an answer of the wrong shape: Redis is up, so
        # keep asking (no breaker), but never hold the run back for it.
        return _fail_open(organization_id, exc)
    if bucket.allowed:
        return Decision(DISPATCHED, tokens=bucket.tokens)
    return Decision(LIMITED, ms_to_next_token=bucket.ms_to_next_token)


def take_ahead(*, organization_id: int, rate: int) -> Bucket | None:
    """A token spent before the claim statement runs (docs/design.md, "Taking the token ahead"), or None.

    None: no token was spent. The limiter is off, the rate is 0, the bucket is
    empty, the breaker is open or Redis failed; the caller then claims the
    ordinary way, whose :func:`consume` applies the policy (and counts a fail
    open only for a claim that won a run). A connection error opens the
    breaker here too, so that claim does not wait for Redis a second time.
    """
    global _breaker
    if not conf.get().rate_limit_enabled or rate <= 0:
        return None
    try:
        client = gantry_redis.client()
    except ValueError:  # a malformed REDIS_URL: consume() reports it
        return None
    if _breaker_open(client):
        return None
    try:
        bucket = take(organization_id=organization_id, rate=rate)
    except (redis.ConnectionError, redis.TimeoutError):
        _breaker = (client, time.monotonic() + BREAKER_SECONDS)
        return None
    except (redis.RedisError, OSError, ValueError, TypeError):
        return None
    return bucket if bucket.allowed else None


def refund(*, organization_id: int, rate: int) -> None:
    """Give back a token taken ahead of a claim that dispatched nothing; best effort, never raises.

    A refund that cannot reach Redis loses that token, as a claim whose
    commit fails after its take always has (the bucket refills).
    """
    try:
        give_back(organization_id=organization_id, rate=rate)
    except (redis.RedisError, OSError, ValueError, TypeError) as exc:
        log.warning(
            "a token taken ahead of a claim could not be given back",
            extra={"event": "throttle.refund_failed", "organization_id": organization_id, "error": repr(exc)},
        )


def _fail_open(organization_id: int, exc: BaseException) -> Decision:
    FAIL_OPEN_TOTAL.inc()
    log.warning(
        "dispatch throttle unavailable, dispatching without a token",
        extra={
            "event": "throttle.fail_open",
            "organization_id": organization_id,
            "error": f"{exc.__class__.__name__}: {exc}",
        },
    )
    return Decision(FAILED_OPEN)


# Set by the backend dispatcher around its claims (:func:`tallied`): its
# process serves no /metrics, so its counts go to Redis with the tick's other
# figures instead of this process's counter, and every scrape sees them.
_tally: ContextVar[collections.Counter[str] | None] = ContextVar("gantry_dispatch_tally", default=None)


def record(outcome: Outcome) -> None:
    """Count a claim's outcome once its transaction has settled (committed, or rolled back when limited)."""
    tally = _tally.get()
    if tally is not None:
        tally[outcome] += 1
        return
    DISPATCH_TOTAL.labels(outcome=outcome).inc()


@contextmanager
def tallied() -> Iterator[collections.Counter[str]]:
    """Count the outcomes of the claims made inside into the answered Counter rather than this process's."""
    tally: collections.Counter[str] = collections.Counter()
    token = _tally.set(tally)
    try:
        yield tally
    finally:
        _tally.reset(token)


# Rate 0 never refills; a stamp for it still ends, an hour on, so that a rate
# changed behind the service's back (raw SQL) costs at most an hour.
MAX_STAMP = timedelta(hours=1)


def throttled_until(*, now: datetime, ms_to_next_token: int | None) -> datetime:
    """The deferral stamp for a limited claim: when the bucket yields its next token."""
    if ms_to_next_token is None:
        return now + MAX_STAMP
    return now + min(MAX_STAMP, timedelta(milliseconds=ms_to_next_token))


# ---------------------------------------------------------------- the budget API


@dataclass(frozen=True)
class Budget:
    runs_per_hour_limit: int
    burst: int
    tokens_available: int | None  # whole tokens now; None when Redis could not say
    throttled: bool
    next_slot_at: datetime | None
    seconds_to_next_slot: int | None  # None only when no slot ever comes (rate 0)
    dispatch_throttled_until: datetime | None
    answered_from: Literal["bucket", "stamp", "disabled"]


def budget(*, organization_id: int, rate: int, stamp: datetime | None, now: datetime) -> Budget:
    """The org's dispatch budget for the budget API; answers even when Redis is down."""

    def answer(
        tokens: int | None, wait_ms: int | None, answered_from: Literal["bucket", "stamp", "disabled"]
    ) -> Budget:
        throttled = wait_ms is None or wait_ms > 0
        return Budget(
            runs_per_hour_limit=rate,
            burst=burst_for(rate),
            tokens_available=tokens,
            throttled=throttled,
            next_slot_at=None if wait_ms is None or wait_ms == 0 else now + timedelta(milliseconds=wait_ms),
            seconds_to_next_slot=None if wait_ms is None else math.ceil(wait_ms / 1000),
            dispatch_throttled_until=stamp,
            answered_from=answered_from,
        )

    def from_stamp() -> Budget:
        # What is known without Redis: the stamp of the last throttled claim.
        wait_ms = 0
        if stamp is not None and stamp > now:
            wait_ms = math.ceil((stamp - now).total_seconds() * 1000)
        return answer(None, wait_ms, "stamp")

    if not conf.get().rate_limit_enabled:
        return answer(None, 0, "disabled")
    try:
        if rate > 0 and _breaker_open(gantry_redis.client()):
            return from_stamp()  # claims are failing open; don't make the banner wait on Redis either
        bucket = peek(organization_id=organization_id, rate=rate)
    except (redis.RedisError, OSError, ValueError, TypeError) as exc:
        log.warning(
            "dispatch budget read from the throttle stamp: Redis unavailable",
            extra={"event": "throttle.peek_failed", "organization_id": organization_id, "error": repr(exc)},
        )
        return from_stamp()
    # floor: "1 token available" must never be shown while a claim would still be refused.
    return answer(math.floor(bucket.tokens), bucket.ms_to_next_token, "bucket")
