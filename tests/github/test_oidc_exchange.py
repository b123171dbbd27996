"""``POST /api/v1/runners/{runner_id}/oidc-exchange``: a GitHub OIDC token for the runner token, once.

Every token comes from the local issuer (discovery + JWKS, RS256 with a test
key); Gantry fetches its keys over HTTP like it would GitHub's.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core.models import Organization, Run, Runner, RunStatus
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import AUDIENCE, OWNER, REF, REPO, WORKFLOW, gha_group, pending_runs
from tests.github.fakes import FakeGitHub, OidcIssuer, rsa_key, run_claims

pytestmark = pytest.mark.django_db


def url(runner_id: object) -> str:
    return f"/api/v1/runners/{runner_id}/oidc-exchange"


def dispatched(org: Organization) -> tuple[Run, Runner]:
    gha_group(org)
    (run,) = pending_runs(org, 1)
    assert Dispatcher().tick().launched == 1
    run.refresh_from_db()
    return run, Runner.objects.get(id=run.assigned_runner_id)


def good_claims(runner: Runner) -> dict[str, Any]:
    assert runner.workflow_run_id is not None
    return {"aud": AUDIENCE, **run_claims(owner=OWNER, repo=REPO, workflow_file=WORKFLOW, ref=REF,
                                          run_id=runner.workflow_run_id)}  # fmt: skip


def untouched(run: Run, runner: Runner) -> None:
    row = Runner.objects.get(id=runner.id)
    assert row.oidc_exchanged_at is None
    assert row.workflow_run_id == runner.workflow_run_id
    assert row.status == runner.status
    assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED


def test_it_answers_a_runner_token_that_works_on_the_runner_routes(
    acme: Organization, github: FakeGitHub, issuer: OidcIssuer
) -> None:
    run, runner = dispatched(acme)

    response = APIClient().post(url(runner.id), {"token": issuer.mint(**good_claims(runner))}, format="json")

    assert response.status_code == 200, response.content
    token = response.json()["runner_token"]
    assert Runner.objects.get(id=runner.id).oidc_exchanged_at is not None
    as_runner = APIClient()
    as_runner.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert as_runner.post(f"/api/v1/runners/{runner.id}/ready", {}, format="json").status_code == 204
    accepted = as_runner.post(f"/api/v1/runs/{run.id}/accept", format="json")
    assert accepted.status_code == 200
    assert accepted.json()["run_id"] == str(run.id)


@pytest.mark.parametrize(
    ("case", "change", "status", "code"),
    [
        ("wrong audience", {"aud": "someone-else"}, 401, "oidc_token_invalid"),
        ("wrong repository", {"repository": f"{OWNER}/other"}, 403, "oidc_claims_mismatch"),
        (
            "wrong workflow",
            {"workflow_ref": f"{OWNER}/{REPO}/.github/workflows/other.yml@refs/heads/{REF}"},
            403,
            "oidc_claims_mismatch",
        ),
        ("expired", {"exp": int(time.time()) - 600, "iat": int(time.time()) - 900}, 401, "oidc_token_invalid"),
        ("another run's workflow run id", {"run_id": "123"}, 403, "oidc_claims_mismatch"),
        ("another issuer", {"iss": "https://token.actions.example.invalid"}, 401, "oidc_token_invalid"),
        ("not a dispatch", {"event_name": "push"}, 403, "oidc_claims_mismatch"),
    ],
)
def test_it_refuses_a_token_that_is_not_this_runners(
    acme: Organization, github: FakeGitHub, issuer: OidcIssuer, case: str, change: dict[str, Any], status: int,
    code: str,
) -> None:  # fmt: skip
    run, runner = dispatched(acme)

    token = issuer.mint(**{**good_claims(runner), **change})
    response = APIClient().post(url(runner.id), {"token": token}, format="json")

    assert response.status_code == status, (case, response.content)
    assert response.json()["code"] == code
    untouched(run, runner)


def test_it_refuses_a_token_signed_with_a_key_the_issuer_does_not_publish(
    acme: Organization, github: FakeGitHub, issuer: OidcIssuer
) -> None:
    run, runner = dispatched(acme)
    api = APIClient()
    assert api.post(url(uuid.uuid4()), {"token": issuer.mint(**good_claims(runner))}, format="json").status_code == 404
    fetched = issuer.jwks_fetches  # the keys are cached now

    forged = issuer.mint(key=rsa_key(), kid="unknown-kid", **good_claims(runner))
    response = api.post(url(runner.id), {"token": forged}, format="json")

    assert response.status_code == 401
    assert response.json()["code"] == "oidc_token_invalid"
    assert issuer.jwks_fetches == fetched + 1  # an unknown kid makes Gantry look at the JWKS again, once
    again = api.post(url(runner.id), {"token": forged}, format="json")
    assert again.status_code == 401
    assert issuer.jwks_fetches == fetched + 1  # ...and not again right away
    # The issuer's own key but a forged signature (a known kid):
    impostor = issuer.mint(key=rsa_key(), **good_claims(runner))
    assert api.post(url(runner.id), {"token": impostor}, format="json").status_code == 401
    untouched(run, runner)


def test_a_replayed_exchange_is_refused(acme: Organization, github: FakeGitHub, issuer: OidcIssuer) -> None:
    _, runner = dispatched(acme)
    token = issuer.mint(**good_claims(runner))
    api = APIClient()
    assert api.post(url(runner.id), {"token": token}, format="json").status_code == 200
    stamped = Runner.objects.get(id=runner.id).oidc_exchanged_at

    replay = api.post(url(runner.id), {"token": token}, format="json")
    fresh = api.post(url(runner.id), {"token": issuer.mint(**good_claims(runner))}, format="json")

    assert replay.status_code == 403
    assert replay.json()["code"] == "oidc_exchange_used"
    assert fresh.status_code == 403
    assert fresh.json()["code"] == "oidc_exchange_used"
    assert Runner.objects.get(id=runner.id).oidc_exchanged_at == stamped


def test_a_runner_of_another_run_cannot_use_this_runs_token(
    acme: Organization, github: FakeGitHub, issuer: OidcIssuer
) -> None:
    gha_group(acme)
    first, second = pending_runs(acme, 2)
    Dispatcher().tick()
    one, two = (Runner.objects.get(id=Run.objects.get(id=r.id).assigned_runner_id) for r in (first, second))

    # The workflow run dispatched for runner one presents its (genuine) token at runner two.
    response = APIClient().post(url(two.id), {"token": issuer.mint(**good_claims(one))}, format="json")

    assert response.status_code == 403
    assert response.json()["code"] == "oidc_claims_mismatch"
    assert Runner.objects.get(id=two.id).oidc_exchanged_at is None


def test_a_malformed_body_is_a_400_and_garbage_is_a_401(acme: Organization, github: FakeGitHub) -> None:
    _, runner = dispatched(acme)
    api = APIClient()

    assert api.post(url(runner.id), {}, format="json").status_code == 400
    response = api.post(url(runner.id), {"token": "not-a-jwt"}, format="json")
    assert response.status_code == 401
    assert response.json()["code"] == "oidc_token_invalid"
    hs = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.e30.ZRrHA1JJJW8opsbCGfG_HACGpVUMN_a9IV7pAx_Zmeo"
    assert api.post(url(runner.id), {"token": hs}, format="json").json()["code"] == "oidc_token_invalid"
    assert Runner.objects.get(id=runner.id).oidc_exchanged_at is None


def test_a_self_hosted_runner_cannot_be_exchanged_for(
    acme: Organization, github: FakeGitHub, issuer: OidcIssuer
) -> None:
    from gantry.dispatch.claim import claim
    from tests.dispatch.helpers import deploy, make_group, make_stack

    group = make_group(acme, "self", {"os": "linux"})
    deploy(make_stack(acme, "web", {"os": "linux"}))
    got = claim(group=group, now=timezone.now())
    assert got is not None
    claims = {"aud": AUDIENCE, **run_claims(owner=OWNER, repo=REPO, workflow_file=WORKFLOW, ref=REF, run_id=1)}

    response = APIClient().post(url(got.runner_id), {"token": issuer.mint(**claims)}, format="json")

    assert response.status_code == 403
    assert response.json()["code"] == "oidc_claims_mismatch"
