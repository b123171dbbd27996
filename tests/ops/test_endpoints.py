"""The ops endpoints: liveness, readiness (database + Redis) and Prometheus metrics."""

from __future__ import annotations

import socket

import pytest
from django.test import Client, override_settings


def _closed_port() -> int:
    # A port that was free a moment ago and has nothing listening on it now.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_it_answers_healthz(client: Client) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.django_db
def test_it_is_ready_when_database_and_redis_answer(client: Client) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200, r.content
    assert r.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


@pytest.mark.django_db
def test_it_is_not_ready_and_names_redis_without_its_error_text_to_anonymous_callers(client: Client) -> None:
    port = _closed_port()
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{port}/0"):
        r = client.get("/readyz")
    assert r.status_code == 503, r.content
    assert r.json() == {"status": "unavailable", "checks": {"database": "ok", "redis": "error"}}
    assert str(port) not in r.content.decode()


@pytest.mark.django_db
def test_staff_see_the_failing_dependencys_error_text(client: Client, owner: object) -> None:
    client.login(username="owner", password="pw-owner")  # the owner persona is staff
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0"):
        r = client.get("/readyz")
    assert r.status_code == 503, r.content
    body = r.json()
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error: ")
    assert "Connection" in body["checks"]["redis"]


# A scrape reads the reapers' and runs' figures from Redis and the orgs from the database.
@pytest.mark.django_db
def test_it_serves_prometheus_metrics(client: Client) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain; version=")
    text = r.content.decode()
    assert "# TYPE python_info gauge" in text
    # Every sample line is "name{labels} value": the exposition format, not HTML or JSON.
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples
    assert all(len(line.rsplit(" ", 1)) == 2 for line in samples)
