"""Who may read /metrics (a bearer token or an allowed peer address), and what a scrape costs the database.

The series name every org, its queue and its groups, so an anonymous client
from an address outside GANTRY_METRICS_ALLOW gets 401, a wrong token 403
(docs/queue.md, "Who may scrape"). The database-derived series are one
statement per family whatever the org count, and kept for
GANTRY_METRICS_CACHE_SECONDS, so a second scrape within that time runs none.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from gantry import conf, metrics
from gantry.core.models import Organization
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.required_tools import require_tool

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-metrics-token-for-tests"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def metrics_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Set GANTRY_METRICS_* for one test (conf re-read), and put them back after."""
    monkeypatch.setenv("GANTRY_METRICS_TOKEN", TOKEN)
    conf.get.cache_clear()
    metrics.ScrapeMemo.clear_all()
    yield monkeypatch
    monkeypatch.undo()
    conf.get.cache_clear()
    metrics.ScrapeMemo.clear_all()


def _set(env: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        env.setenv(name, value)
    conf.get.cache_clear()


def _scrape(remote_addr: str = "127.0.0.1", **headers: str) -> tuple[int, dict[str, str], str]:
    r = Client().get("/metrics", REMOTE_ADDR=remote_addr, headers=headers)
    return r.status_code, dict(r.headers), r.content.decode()


def _group_in(org: Organization) -> None:
    group = make_group(org, "linux", {"os": "linux"})
    deploy(make_stack(org, "app", {"os": "linux"}))
    assert group.id


def test_it_refuses_an_anonymous_client_from_outside_the_allow_list(
    metrics_env: pytest.MonkeyPatch, acme: Organization
) -> None:
    _group_in(acme)
    status, headers, body = _scrape("203.0.113.9")
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(body)["code"] == "not_authenticated"
    assert "acme" not in body
    assert "gantry_" not in body


def test_it_refuses_a_wrong_token_even_from_an_allowed_address(metrics_env: pytest.MonkeyPatch) -> None:
    for authorization in (f"Bearer {TOKEN}x", "Bearer ", f"Token {TOKEN}", TOKEN):
        status, _, body = _scrape("127.0.0.1", Authorization=authorization)
        assert status == 403, authorization
        assert json.loads(body)["code"] == "forbidden"
        assert "gantry_" not in body


def test_the_token_reads_every_orgs_series_from_anywhere(metrics_env: pytest.MonkeyPatch, acme: Organization) -> None:
    _group_in(acme)
    status, _, body = _scrape("203.0.113.9", Authorization=f"Bearer {TOKEN}")
    assert status == 200
    assert 'gantry_runner_group_runnable_demand{group="' in body
    assert 'org="acme"' in body


def test_the_scrape_passes_promtools_lint(metrics_env: pytest.MonkeyPatch, acme: Organization) -> None:
    _group_in(acme)
    status, _, body = _scrape("203.0.113.9", Authorization=f"Bearer {TOKEN}")
    assert status == 200
    promtool = require_tool("promtool", "prometheus")
    checked = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_no_token_is_accepted_when_none_is_configured(metrics_env: pytest.MonkeyPatch) -> None:
    _set(metrics_env, GANTRY_METRICS_TOKEN="")
    assert _scrape("203.0.113.9", Authorization="Bearer ")[0] == 403
    assert _scrape("203.0.113.9", Authorization="Bearer anything")[0] == 403


def test_an_allowed_address_scrapes_without_a_token(metrics_env: pytest.MonkeyPatch, acme: Organization) -> None:
    _group_in(acme)
    _set(metrics_env, GANTRY_METRICS_ALLOW="10.0.0.0/8, 2001:db8::/32")
    assert _scrape("10.20.30.40")[0] == 200
    assert _scrape("2001:db8::7")[0] == 200
    assert _scrape("11.0.0.1")[0] == 401
    # The peer address decides, never a header the client writes.
    assert _scrape("11.0.0.1", **{"X-Forwarded-For": "10.20.30.40"})[0] == 401
    # No longer in the list: loopback is refused too.
    assert _scrape("127.0.0.1")[0] == 401


def test_the_default_allow_list_is_loopback(metrics_env: pytest.MonkeyPatch) -> None:
    metrics_env.delenv("GANTRY_METRICS_ALLOW", raising=False)
    conf.get.cache_clear()
    assert _scrape("127.0.0.1")[0] == 200
    assert _scrape("::1")[0] == 200
    assert _scrape("::ffff:127.0.0.1")[0] == 200
    assert _scrape("192.168.1.1")[0] == 401


def test_an_empty_allow_list_admits_no_address(metrics_env: pytest.MonkeyPatch) -> None:
    _set(metrics_env, GANTRY_METRICS_ALLOW="")
    status, headers, _ = _scrape("127.0.0.1")
    assert status == 401
    assert "WWW-Authenticate" in headers
    assert _scrape("127.0.0.1", Authorization=f"Bearer {TOKEN}")[0] == 200


@pytest.mark.parametrize("value", ["10.0.0.300/8", "loopback", "10.1.2.3/8"])
def test_a_malformed_allow_list_stops_the_start(value: str, tmp_path: Path) -> None:
    from tests.ops.test_settings import _check

    result = _check(tmp_path, GANTRY_METRICS_ALLOW=f"127.0.0.1/32,{value}")
    assert result.returncode != 0
    assert "GANTRY_METRICS_ALLOW" in result.stderr
    assert repr(value) in result.stderr


def _scrape_queries() -> int:
    with CaptureQueriesContext(connection) as queries:
        assert _scrape("127.0.0.1")[0] == 200
    return len(queries.captured_queries)


def test_a_scrape_runs_as_many_statements_for_thirty_orgs_as_for_one(metrics_env: pytest.MonkeyPatch) -> None:
    _set(metrics_env, GANTRY_METRICS_CACHE_SECONDS="0")
    _group_in(Organization.objects.create(slug="org-0", name="Org 0"))
    one = _scrape_queries()
    for i in range(1, 30):
        _group_in(Organization.objects.create(slug=f"org-{i}", name=f"Org {i}"))
    thirty = _scrape_queries()
    assert one > 0
    assert thirty == one


def test_a_second_scrape_within_the_cache_period_runs_no_statement(metrics_env: pytest.MonkeyPatch) -> None:
    # The longest allowed: the two scrapes fall within it however slow the machine is.
    _set(metrics_env, GANTRY_METRICS_CACHE_SECONDS="300")
    _group_in(Organization.objects.create(slug="org-0", name="Org 0"))
    assert _scrape_queries() > 0
    assert _scrape_queries() == 0
    metrics.ScrapeMemo.clear_all()
    assert _scrape_queries() > 0


def test_the_cache_setting_is_bounded(tmp_path: Path) -> None:
    from tests.ops.test_settings import _check

    result = _check(tmp_path, GANTRY_METRICS_CACHE_SECONDS="-1")
    assert result.returncode != 0
    assert "GANTRY_METRICS_CACHE_SECONDS" in result.stderr


def test_the_tokens_value_never_shows_in_the_configurations_repr(metrics_env: pytest.MonkeyPatch) -> None:
    shown = repr(conf.get())
    assert "metrics_allow" in shown
    assert TOKEN not in shown


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_production_server_checks_too(tmp_path: Path) -> None:
    """Under gunicorn + gantry.asgi (the fast lane on), /metrics still goes through Django and this check."""
    from tests.asgi.server import asgi_server, get

    with asgi_server(tmp_path, GANTRY_METRICS_ALLOW="", GANTRY_METRICS_TOKEN=TOKEN) as server:
        refused = get(server.base, "/metrics")
        assert refused.status == 401
        assert refused.headers is not None
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert get(server.base, "/metrics", token=f"{TOKEN}x").status == 403
        with urllib.request.urlopen(
            urllib.request.Request(f"{server.base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}), timeout=30
        ) as resp:
            assert resp.status == 200
            assert "# TYPE gantry_queue_runs_waiting gauge" in resp.read().decode()


def test_conf_reads_the_three_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token_file = tmp_path / "metrics-token"
    token_file.write_text(f"{TOKEN}\n")
    monkeypatch.setenv("GANTRY_METRICS_TOKEN_FILE", str(token_file))  # a mounted Secret, as in Kubernetes
    monkeypatch.setenv("GANTRY_METRICS_ALLOW", " 10.0.0.0/8 ,, fd00::/8,192.0.2.7 ")
    monkeypatch.setenv("GANTRY_METRICS_CACHE_SECONDS", "2.5")

    found = conf.get.__wrapped__()  # uncached: the settings loaded stay as they are

    assert found.metrics_token == TOKEN
    assert [str(n) for n in found.metrics_allow] == ["10.0.0.0/8", "fd00::/8", "192.0.2.7/32"]
    assert found.metrics_cache_seconds == 2.5
    monkeypatch.delenv("GANTRY_METRICS_TOKEN_FILE")
    monkeypatch.delenv("GANTRY_METRICS_ALLOW")
    monkeypatch.delenv("GANTRY_METRICS_CACHE_SECONDS")
    defaults = conf.get.__wrapped__()
    assert (defaults.metrics_token, defaults.metrics_cache_seconds) == ("", 5.0)
    assert [str(n) for n in defaults.metrics_allow] == ["127.0.0.1/32", "::1/128"]
