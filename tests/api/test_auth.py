"""The auth matrix: each kind of credential against each route family.

No credentials → 401; a forged, expired, revoked or unknown-audience token →
401; a valid token of the wrong kind → 403; another org's object → 404; and in
every refused case nothing changes.
"""

from __future__ import annotations

import time
import uuid

import jwt
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Deployment, Organization, Run, Runner, RunnerGroup, Stack

from ..conftest import SPEC


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _signed(claims: dict[str, object], *, key: str | None = None, kid: str | None = None) -> str:
    kid = kid or settings.GANTRY_JWT_SIGNING_KID
    return jwt.encode(
        {"iss": "gantry", **claims}, key or settings.GANTRY_JWT_KEYS[kid], algorithm="HS256", headers={"kid": kid}
    )


@pytest.fixture
def group_token(group: RunnerGroup) -> str:
    return tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


@pytest.fixture
def runner_token(group: RunnerGroup, stack: Stack) -> str:
    deployment = services.deployment_create(stack=stack)
    run = deployment.runs.get()
    runner = Runner.objects.create(runner_group=group)
    services.run_assign(run_id=run.id, runner=runner)
    return tokens.mint_runner_token(runner_id=runner.id, run_id=run.id, group_id=group.id)


# A representative route of each user-route family: (method, path template, body).
USER_ROUTES = [
    ("get", "/api/v1/orgs/acme", None),
    ("get", "/api/v1/orgs/acme/runner-groups", None),
    ("post", "/api/v1/orgs/acme/stacks", {"name": "s2"}),
    ("post", "/api/v1/stacks/{stack}/deployments", {}),
    ("get", "/api/v1/runs/{run}", None),
]


@pytest.fixture
def paths(stack: Stack) -> dict[str, str]:
    deployment = services.deployment_create(stack=stack)
    return {"stack": str(stack.id), "run": str(deployment.runs.get().id)}


def _call(client: APIClient, method: str, path: str, body: object, paths: dict[str, str]) -> int:
    return int(getattr(client, method)(path.format(**paths), body, format="json").status_code)


@pytest.mark.parametrize(("method", "path", "body"), USER_ROUTES)
def test_it_answers_401_without_credentials(
    anon: APIClient, paths: dict[str, str], method: str, path: str, body: object
) -> None:
    before = (Stack.objects.count(), Deployment.objects.count())
    assert _call(anon, method, path, body, paths) == 401
    assert (Stack.objects.count(), Deployment.objects.count()) == before


@pytest.mark.parametrize(("method", "path", "body"), USER_ROUTES)
def test_it_refuses_group_and_runner_tokens_on_user_routes(
    group_token: str, runner_token: str, paths: dict[str, str], method: str, path: str, body: object
) -> None:
    before = (Stack.objects.count(), Deployment.objects.count())
    for token in (group_token, runner_token):
        response = getattr(_bearer(token), method)(path.format(**paths), body, format="json")
        assert response.status_code == 403
        assert response.json()["code"] == "forbidden"
    assert (Stack.objects.count(), Deployment.objects.count()) == before


@pytest.mark.parametrize(("method", "path", "body"), USER_ROUTES)
def test_it_hides_another_orgs_objects(
    outsider_api: APIClient, paths: dict[str, str], method: str, path: str, body: object
) -> None:
    before = (Stack.objects.count(), Deployment.objects.count())
    response = getattr(outsider_api, method)(path.format(**paths), body, format="json")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert (Stack.objects.count(), Deployment.objects.count()) == before


def test_it_rejects_forged_expired_and_foreign_tokens(group: RunnerGroup, runner_token: str) -> None:
    good = {"aud": "runner-group", "sub": str(group.id), "ver": group.token_version}
    bad_tokens = {
        "forged signature": _signed(good, key="not-the-key-" * 4),
        "unknown key id": _signed(good, kid="nope", key="x" * 40),
        "expired": _signed({**good, "exp": int(time.time()) - 10}),
        "wrong audience": _signed({**good, "aud": "somebody-else"}),
        "wrong issuer": jwt.encode(
            {**good, "iss": "evil"},
            settings.GANTRY_JWT_KEYS[settings.GANTRY_JWT_SIGNING_KID],
            algorithm="HS256",
            headers={"kid": settings.GANTRY_JWT_SIGNING_KID},
        ),
        "alg none": jwt.encode(good, key=None, algorithm="none"),
        "garbage": "not.a.jwt",
        "group gone": _signed({**good, "sub": "999999"}),
        "runner gone": _signed({"aud": "runner", "sub": str(uuid.uuid4()), "run": str(uuid.uuid4()), "grp": group.id}),
    }
    for name, token in bad_tokens.items():
        response = _bearer(token).get("/api/v1/orgs")
        assert response.status_code == 401, name
        assert response.json()["code"] == "authentication_failed", name


def test_it_revokes_a_group_token_at_once_on_rotation(group: RunnerGroup, group_token: str) -> None:
    assert tokens.decode(group_token).raw["ver"] == group.token_version
    new = services.runner_group_rotate_token(group=group)
    # The old token now fails authentication (401), the new one authenticates
    # (and is then refused on a user route with 403: right identity, wrong route).
    assert _bearer(group_token).get("/api/v1/orgs").status_code == 401
    assert _bearer(new).get("/api/v1/orgs").status_code == 403


def test_it_rejects_a_runner_token_once_its_runner_is_gone(runner_token: str) -> None:
    assert _bearer(runner_token).get("/api/v1/orgs").status_code == 403
    Runner.objects.all().delete()
    assert _bearer(runner_token).get("/api/v1/orgs").status_code == 401


def test_it_refuses_admin_calls_to_a_member(teammate_api: APIClient, acme: Organization, group: RunnerGroup) -> None:
    version = group.token_version
    calls = [
        ("post", "/api/v1/orgs/acme/runner-groups", {"name": "g2"}),
        ("post", "/api/v1/orgs/acme/stacks", {"name": "s2", "spec": SPEC}),
        ("post", "/api/v1/orgs/acme/members", {"username": "eve", "role": "admin"}),
        ("patch", "/api/v1/orgs/acme", {"name": "Renamed"}),
        ("post", f"/api/v1/runner-groups/{group.id}/rotate-token", None),
        ("post", f"/api/v1/runner-groups/{group.id}/drain", None),
        ("patch", f"/api/v1/runner-groups/{group.id}", {"max_concurrent_runs": 1}),
    ]
    for method, path, body in calls:
        response = getattr(teammate_api, method)(path, body, format="json")
        assert response.status_code == 403, path
        assert response.json()["code"] == "forbidden"
    group.refresh_from_db()
    acme.refresh_from_db()
    assert (group.token_version, group.drained, group.max_concurrent_runs) == (version, False, 10)
    assert acme.name == "Acme"
    assert not User.objects.filter(username="eve").exists()
    assert RunnerGroup.objects.count() == 1


def test_it_lets_a_member_do_member_calls(teammate_api: APIClient, stack: Stack) -> None:
    created = teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json")
    assert created.status_code == 201
    run_id = created.json()["run"]["id"]
    assert teammate_api.get(f"/api/v1/runs/{run_id}").status_code == 200
    assert teammate_api.post(f"/api/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"


def test_it_lets_only_superusers_set_the_rate(
    owner_api: APIClient, teammate_api: APIClient, root_api: APIClient, acme: Organization
) -> None:
    body = {"runs_per_hour_limit": 50}
    for client in (owner_api, teammate_api):
        response = client.put("/api/v1/orgs/acme/runs-per-hour-limit", body, format="json")
        assert response.status_code == 403
    acme.refresh_from_db()
    assert acme.runs_per_hour_limit == 2
    response = root_api.put("/api/v1/orgs/acme/runs-per-hour-limit", body, format="json")
    assert response.status_code == 200
    assert response.json()["runs_per_hour_limit"] == 50


def test_it_rejects_a_malformed_authorization_header(acme: Organization) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    assert client.get("/api/v1/orgs").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    assert client.get("/api/v1/orgs").status_code == 401


def test_it_keeps_accepting_tokens_signed_by_a_retired_key(group: RunnerGroup, settings: object) -> None:
    old = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    # Rotate signing keys: a new key signs, the old one still verifies.
    settings.GANTRY_JWT_KEYS = {"k2": "n" * 40, "default": settings.GANTRY_JWT_KEYS["default"]}  # type: ignore[attr-defined]
    settings.GANTRY_JWT_SIGNING_KID = "k2"  # type: ignore[attr-defined]
    new = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    assert jwt.get_unverified_header(new)["kid"] == "k2"
    for token in (old, new):
        assert _bearer(token).get("/api/v1/orgs").status_code == 403  # authenticated; wrong route kind


def test_it_binds_a_runner_token_to_its_group(group: RunnerGroup, globex: Organization, runner_token: str) -> None:
    claims = tokens.decode(runner_token).raw
    other, _ = services.runner_group_create(org=globex, name="other")
    forged_group = _signed({**claims, "grp": other.id})
    assert _bearer(forged_group).get("/api/v1/orgs").status_code == 401
    assert Run.objects.filter(status="assigned").count() == 1


def test_a_minted_runner_token_is_remembered_as_its_verification_would_read_it() -> None:
    runner_id, run_id = uuid.uuid4(), uuid.uuid4()
    token = tokens.mint_runner_token(runner_id=runner_id, run_id=run_id, group_id=7)
    keys = tuple(sorted(settings.GANTRY_JWT_KEYS.items()))
    remembered = tokens._VERIFIED.pop((token, keys))  # seeded at mint; dropped so decode verifies afresh
    assert tokens.decode(token) == remembered
    assert remembered.raw == {"iss": "gantry", "aud": "runner", "sub": str(runner_id), "run": str(run_id), "grp": 7}
