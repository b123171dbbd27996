"""The token bucket itself (one Lua script in Redis): refill, burst, clamp, expiry, peek, NOSCRIPT.

These call ``gantry.dispatch.throttle`` directly against the test Redis; the
org ids are arbitrary (the bucket knows nothing of the database).
"""

from __future__ import annotations

import pytest

from gantry import redis as gantry_redis
from gantry.dispatch import throttle
from tests.throttle.helpers import RedisProcess

ORG = 900_001
OTHER = 900_002


def key(org: int = ORG) -> str:
    return throttle.key_for(org)


def test_it_namespaces_the_key_per_org() -> None:
    assert key(42) == "gantry:bucket:org:42"


def test_it_starts_a_new_bucket_full_and_a_peek_writes_nothing() -> None:
    bucket = throttle.peek(organization_id=ORG, rate=2)
    assert bucket.allowed
    assert bucket.tokens == 48  # burst = 2/h * 24
    assert bucket.ms_to_next_token == 0
    assert not gantry_redis.client().exists(key())


def test_it_spends_the_burst_then_refuses_with_the_time_to_the_next_token() -> None:
    answers = [throttle.take(organization_id=ORG, rate=1) for _ in range(25)]

    assert all(a.allowed for a in answers[:24])
    last = answers[24]
    assert not last.allowed
    assert last.tokens < 0.01
    assert last.ms_to_next_token is not None
    assert 3_590_000 < last.ms_to_next_token <= 3_600_000  # one token at 1/h is an hour away


def test_it_expires_a_bucket_once_it_would_be_full_again() -> None:
    client = gantry_redis.client()
    throttle.take(organization_id=ORG, rate=1)
    assert 3_590_000 < client.pttl(key()) <= 3_600_000  # one token short: an hour to full
    for _ in range(23):
        throttle.take(organization_id=ORG, rate=1)
    assert 24 * 3_600_000 - 60_000 < client.pttl(key()) <= 24 * 3_600_000


def test_a_peek_leaves_a_stored_bucket_untouched() -> None:
    client = gantry_redis.client()
    for _ in range(3):
        throttle.take(organization_id=ORG, rate=1)
    before = client.hgetall(key())
    ttl_before = client.pttl(key())

    peeked = throttle.peek(organization_id=ORG, rate=1)

    assert client.hgetall(key()) == before
    assert client.pttl(key()) <= ttl_before  # not extended
    assert 20.99 < peeked.tokens < 21.01
    assert peeked.allowed


def test_it_refills_at_the_rate_passed_so_a_raised_rate_applies_at_once() -> None:
    for _ in range(24):
        throttle.take(organization_id=ORG, rate=1)
    assert not throttle.peek(organization_id=ORG, rate=1).allowed
    # At 3600/h a token takes a second; the stored timestamp is refilled at the new rate.
    raised = throttle.peek(organization_id=ORG, rate=3600)
    assert raised.ms_to_next_token is not None
    assert raised.ms_to_next_token <= 1000


def test_it_clamps_stored_tokens_to_a_lowered_burst() -> None:
    throttle.take(organization_id=ORG, rate=100)  # 2399 of 2400 left
    lowered = throttle.peek(organization_id=ORG, rate=1)
    assert lowered.tokens == 24  # not 2399: the new burst caps it
    after = throttle.take(organization_id=ORG, rate=1)
    assert 22.99 < after.tokens < 23.01


def test_rate_zero_never_allows_and_never_refills() -> None:
    for bucket in (throttle.peek(organization_id=ORG, rate=0), throttle.take(organization_id=ORG, rate=0)):
        assert not bucket.allowed
        assert bucket.tokens == 0
        assert bucket.ms_to_next_token is None  # never
    assert not gantry_redis.client().exists(key())


def test_buckets_of_two_orgs_are_independent() -> None:
    for _ in range(24):
        throttle.take(organization_id=ORG, rate=1)
    assert not throttle.take(organization_id=ORG, rate=1).allowed
    assert throttle.take(organization_id=OTHER, rate=1).allowed


def test_it_reloads_the_script_after_the_server_forgot_it(own_redis: RedisProcess) -> None:
    assert throttle.take(organization_id=ORG, rate=1).allowed  # EVALSHA: loaded on first use
    own_redis.client().script_flush()  # as after a restart or failover

    again = throttle.take(organization_id=ORG, rate=1)

    assert again.allowed
    assert 21.99 < again.tokens < 22.01  # the bucket survived; only the script was reloaded


@pytest.mark.parametrize("rate", [1, 2, 60, 1_000_000])
def test_it_sizes_the_burst_at_a_day_of_the_rate(rate: int) -> None:
    assert throttle.burst_for(rate) == rate * 24
    assert throttle.peek(organization_id=ORG, rate=rate).tokens == rate * 24
