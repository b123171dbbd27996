"""Query strings never 500 (issue 24, deliverable 8): the queue and runs lists, in the API and on the queue page.

Each crafted query string answered a 500 before the fix: ``limit=²`` passed
``str.isdigit()`` and failed ``int()``; 5,000 nines passed Python's
integer-string limit; a cursor whose uuid part is not a string, or nested
deep, or whose time carries a ``+23:59`` offset PostgreSQL refuses. Each now
answers 400 ``invalid_request`` naming the parameter (the API) or a styled
400 page saying what is wrong (the queue page), and changes nothing; the
``+23:59`` offset is converted to UTC, not refused.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from gantry.core.models import Organization, Run, Stack
from gantry.dispatch import queue
from tests.api.test_bad_input import snapshot
from tests.dispatch.helpers import deploy

LISTS = ["/api/v1/orgs/acme/queue", "/api/v1/orgs/acme/runs"]


def cursor_of(value: Any) -> str:
    """A cursor as this API writes them (url-safe base64 of JSON), around any value."""
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


RUN_ID = "6f1c1b0e-3c39-4a39-9d4c-0c1f1d1f1a2b"
NOW = "2026-01-01T10:00:00+00:00"

BAD_LIMITS = {
    "superscript two": "²",
    "arabic-indic digits": "\u0661\u0662",
    "plus sign": "+1",
    "leading space": " 1",
    "underscore": "1_0",
    "negative": "-1",
    "zero": "0",
    "over the maximum": str(queue.PAGE_MAX + 1),
    "twenty digits": "9" * 20,
    "5,000 nines": "9" * 5000,
    "NUL": "1\x00",
    "decimal": "1.5",
}

BAD_CURSORS = {
    "uuid part a number": cursor_of([NOW, 12345]),
    "uuid part a list": cursor_of([NOW, [RUN_ID]]),
    "uuid part not a uuid": cursor_of([NOW, "not-a-uuid"]),
    "time part a number": cursor_of([1767261600, RUN_ID]),
    "time part nested": cursor_of([[NOW], RUN_ID]),
    "time part naive": cursor_of(["2026-01-01T10:00:00", RUN_ID]),
    "time part not a time": cursor_of(["yesterday", RUN_ID]),
    "time past the calendar once in UTC": cursor_of(["9999-12-31T23:59:59-23:59", RUN_ID]),
    "time before the calendar once in UTC": cursor_of(["0001-01-01T00:00:00+23:59", RUN_ID]),
    "three parts": cursor_of([NOW, RUN_ID, "x"]),
    "an object of two keys": cursor_of({NOW: 1, RUN_ID: 2}),
    "a string": cursor_of("x"),
    "nested deep": cursor_of(json.loads("[" * 400 + "]" * 400)),
    "longer than 256 characters": cursor_of([NOW, RUN_ID + " " * 300]),
    "not base64": "!!!",
    "not JSON": base64.urlsafe_b64encode(b"\xff\xfe").decode(),
}


@pytest.fixture
def waiting(stack: Stack) -> list[Run]:
    """Three runs waiting on one stack's lane, oldest first."""
    return [deploy(stack) for _ in range(3)]


def refused(response: Any, field: str) -> None:
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert body["code"] == "invalid_request"
    assert body["field"] == field


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("raw", list(BAD_LIMITS.values()), ids=list(BAD_LIMITS))
def test_it_refuses_a_limit_that_is_not_1_to_19_ascii_digits(
    teammate_api: APIClient, waiting: list[Run], path: str, raw: str
) -> None:
    before = snapshot()
    refused(teammate_api.get(f"{path}?limit={quote(raw)}"), "limit")
    assert snapshot() == before


@pytest.mark.parametrize("name", ["stack_id", "deployment_id"])
@pytest.mark.parametrize("raw", ["²", "+1", " 1", "9" * 20, "9" * 5000, "-1", str(2**63)])
def test_it_refuses_an_id_filter_that_is_not_a_bigint_in_ascii_digits(
    teammate_api: APIClient, waiting: list[Run], name: str, raw: str
) -> None:
    refused(teammate_api.get(f"/api/v1/orgs/acme/runs?{name}={quote(raw)}"), name)


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("cursor", list(BAD_CURSORS.values()), ids=list(BAD_CURSORS))
def test_it_refuses_a_cursor_it_did_not_write(
    teammate_api: APIClient, waiting: list[Run], path: str, cursor: str
) -> None:
    before = snapshot()
    refused(teammate_api.get(f"{path}?cursor={quote(cursor)}"), "cursor")
    assert snapshot() == before


@pytest.mark.parametrize("path", LISTS)
def test_it_converts_a_cursor_time_with_an_offset_postgresql_refuses_to_utc(
    teammate_api: APIClient, waiting: list[Run], path: str
) -> None:
    # The newest run's keyset, written with a +23:59 offset: the same instant, so the same page.
    newest = waiting[-1]
    shifted = newest.created_at.astimezone(UTC).replace(tzinfo=None) + timedelta(hours=23, minutes=59)
    cursor = cursor_of([shifted.isoformat() + "+23:59", str(newest.id)])
    response = teammate_api.get(f"{path}?cursor={cursor}")
    assert response.status_code == 200, response.content[:300]
    ids = [r["id"] for r in response.json()["runs"]]
    if path.endswith("/queue"):  # oldest first: nothing waits after the newest
        assert ids == []
    else:  # newest first: the two older ones follow it
        assert ids == [str(waiting[1].id), str(waiting[0].id)]


def test_decode_cursor_answers_the_time_in_utc() -> None:
    at, _ = queue.decode_cursor(cursor_of(["2026-01-01T23:59:00+23:59", RUN_ID])) or (None, None)
    assert at == datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    assert at is not None
    assert at.utcoffset() == timedelta(0)


def test_the_lists_still_page_with_the_cursors_they_hand_out(teammate_api: APIClient, waiting: list[Run]) -> None:
    first = teammate_api.get("/api/v1/orgs/acme/queue?limit=2").json()
    assert [r["id"] for r in first["runs"]] == [str(r.id) for r in waiting[:2]]
    second = teammate_api.get(f"/api/v1/orgs/acme/queue?limit=2&cursor={first['next_cursor']}").json()
    assert [r["id"] for r in second["runs"]] == [str(waiting[2].id)]
    assert second["next_cursor"] is None
    assert teammate_api.get("/api/v1/orgs/acme/queue?limit=007&cursor=").status_code == 200


# ---------------------------------------------------------------- the queue page


@pytest.fixture
def member_page(teammate: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(teammate)
    return client


@pytest.mark.parametrize(
    "query",
    [
        *(f"limit={quote(raw)}" for raw in BAD_LIMITS.values()),
        *(f"cursor={quote(c)}" for c in BAD_CURSORS.values()),
    ],
    ids=[*(f"limit {k}" for k in BAD_LIMITS), *(f"cursor {k}" for k in BAD_CURSORS)],
)
@pytest.mark.parametrize("partial", ["", "&partial=1"])
def test_the_queue_page_answers_a_bad_query_string_with_a_styled_400(
    member_page: Client, waiting: list[Run], query: str, partial: str
) -> None:
    before = snapshot()
    response = member_page.get(f"/orgs/acme/queue?{query}{partial}")
    assert response.status_code == 400
    html = response.content.decode()
    assert 'data-error-page="400"' in html
    assert re.search(r"(limit|cursor)[^<]*(whole number|handed out)", html), html
    assert 'href="/orgs/acme/queue"' in html  # the nav is there
    assert snapshot() == before


def test_the_queue_page_pages_the_waiting_runs(member_page: Client, waiting: list[Run]) -> None:
    first = member_page.get("/orgs/acme/queue?limit=2")
    assert first.status_code == 200
    html = first.content.decode()
    assert all(f'data-run="{r.id}"' in html for r in waiting[:2])
    assert f'data-run="{waiting[2].id}"' not in html
    next_url = re.search(r'href="([^"]+)" data-next-page', html)
    assert next_url is not None
    second = member_page.get(next_url[1].replace("&amp;", "&")).content.decode()
    assert f'data-run="{waiting[2].id}"' in second
    assert f'data-run="{waiting[0].id}"' not in second
    assert "data-next-page" not in second
    assert "data-first-page" in second


def test_the_rate_form_refuses_what_is_not_a_whole_number(root: User, acme: Organization) -> None:
    client = Client()
    client.force_login(root)
    for raw in ("²", "+5", " 5", "9" * 5000, "1000001", "-1", ""):
        response = client.post("/orgs/acme/rate", {"runs_per_hour_limit": raw}, follow=True)
        assert response.status_code == 200
        assert "The rate must be a whole number" in response.content.decode()
    acme.refresh_from_db()
    assert acme.runs_per_hour_limit == 2  # a new org's rate, unchanged
    client.post("/orgs/acme/rate", {"runs_per_hour_limit": "1"})
    acme.refresh_from_db()
    assert acme.runs_per_hour_limit == 1
