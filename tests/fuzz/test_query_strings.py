"""Query strings fuzzed (issue 24, deliverable 8): the pages' and the lists' ``limit``, ``cursor`` and filters.

Schemathesis (test_schemathesis.py) draws query parameters from the schema,
where ``limit`` is an integer and ``cursor`` any string; it rarely sends what
a person crafts by hand: Unicode digits, signs and spaces, integers past any
column, and cursors that are well-formed base64 around JSON of the wrong
shape (a number for the uuid, deep nesting, a time with a +23:59 offset).
Hypothesis draws those here, from a fixed seed, for the queue page (whole and
``?partial=1``), the queue API and the runs API, as a member of the org. The
only answers allowed: 200, or 400 (a styled page for the page, JSON with a
code for the API); never a 5xx.
"""

from __future__ import annotations

import base64
import json
import os
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from gantry.core.models import Membership, Organization, Role
from tests.conftest import SPEC

pytestmark = pytest.mark.fuzz

SEED = int(os.environ.get("GANTRY_FUZZ_SEED") or 20240610)
EXAMPLES = int(os.environ.get("GANTRY_FUZZ_EXAMPLES") or 25) * 8

PATHS = ["/orgs/acme/queue", "/api/v1/orgs/acme/queue", "/api/v1/orgs/acme/runs"]

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(alphabet="0123456789²³¹\u0661\u0662\u0663\u0664\u0665+- _.e\x00\t\n", max_size=25),
    st.sampled_from(["9" * 5000, "0" * 30 + "1", "1" * 19, "1" * 20]),
    st.text(max_size=30),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
times = st.builds(
    lambda at, tz: at.replace(tzinfo=UTC).astimezone(tz).isoformat() if tz else at.isoformat(),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.none() | offsets,
)
pairs = st.tuples(times | json_values, st.uuids().map(str) | json_values).map(list)


def as_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


cursors = st.one_of(
    st.text(max_size=300),
    json_values.map(as_cursor),
    pairs.map(as_cursor),
    st.integers(min_value=1, max_value=600).map(lambda n: as_cursor(json.loads("[" * n + "]" * n))),
)

queries = st.fixed_dictionaries(
    {},
    optional={
        "limit": numbers,
        "cursor": cursors,
        "stack_id": numbers,
        "deployment_id": numbers,
        "status": st.text(max_size=20),
        "partial": st.sampled_from(["1", "", "0"]),
    },
)


@pytest.fixture
def member(transactional_db: None) -> Client:
    """A member of acme with a few runs waiting. transactional_db: a database error must not poison the test."""
    from gantry.core import services

    org = Organization.objects.create(slug="acme", name="Acme")
    user = User.objects.create_user(username="teammate", password="pw-teammate")
    Membership.objects.create(user=user, organization=org, role=Role.MEMBER)
    stack = services.stack_create(org=org, name="web", spec=SPEC)
    for _ in range(3):
        services.deployment_create(stack=stack)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_no_query_string_makes_a_list_or_the_queue_page_answer_5xx(member: Client) -> None:
    failures: list[str] = []

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=["generate"],
    )
    @given(path=st.sampled_from(PATHS), query=queries)
    def one(path: str, query: dict[str, str]) -> None:
        url = f"{path}?{urlencode(query)}"
        response = member.get(url)
        if response.status_code not in (200, 400):
            failures.append(f"{response.status_code} {url[:300]}")
        elif response.status_code == 400 and path.startswith("/api/"):
            if not response.json().get("code"):
                failures.append(f"400 without a code: {url[:300]}")
        elif response.status_code == 400 and b'data-error-page="400"' not in response.content:
            failures.append(f"400 without the styled page: {url[:300]}")

    one()
    assert failures == []
