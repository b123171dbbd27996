"""Stacks: secret values are write-only; labels and spec are validated like the API does."""

from __future__ import annotations

import json

from django.test import Client

from gantry.core import secrets, services
from gantry.core.models import Organization, Priority, Stack
from tests.admin.helpers import url
from tests.conftest import SPEC


def plain(stack: Stack) -> dict[str, str]:
    """The stack's secrets as a run would get them; the stored values are ciphertext."""
    stack.refresh_from_db()
    clear = secrets.unseal(stack.secrets)
    assert all(stack.secrets[name] != value for name, value in clear.items())
    return clear


def _with_secret(stack: Stack) -> Stack:
    return services.stack_update(stack=stack, secrets={"DB_PASSWORD": "hunter2-secret"})


def test_it_never_shows_secret_values(owner_admin: Client, stack: Stack) -> None:
    _with_secret(stack)
    listing = owner_admin.get(url("stack")).content.decode()
    detail = owner_admin.get(url("stack", "change", stack.pk)).content.decode()
    assert "DB_PASSWORD" in listing
    assert "DB_PASSWORD" in detail
    assert "hunter2-secret" not in listing
    assert "hunter2-secret" not in detail


def test_it_sets_and_removes_secrets(owner_admin: Client, stack: Stack) -> None:
    _with_secret(stack)
    services.stack_update(stack=stack, secrets={"DB_PASSWORD": "hunter2-secret", "OLD": "x"})
    r = owner_admin.post(
        url("stack", "change", stack.pk),
        {
            "name": "web",
            "labels": json.dumps(stack.labels),
            "spec": json.dumps(stack.spec),
            "secrets_update": '{"API_KEY": "k", "OLD": null}',
        },
    )
    assert r.status_code == 302
    assert plain(stack) == {"DB_PASSWORD": "hunter2-secret", "API_KEY": "k"}


def test_it_keeps_secrets_when_the_field_is_left_empty(owner_admin: Client, stack: Stack) -> None:
    _with_secret(stack)
    r = owner_admin.post(
        url("stack", "change", stack.pk),
        {"name": "web2", "labels": json.dumps(stack.labels), "spec": json.dumps(stack.spec), "secrets_update": ""},
    )
    assert r.status_code == 302
    assert plain(stack) == {"DB_PASSWORD": "hunter2-secret"}
    assert stack.name == "web2"


def test_it_creates_a_stack(owner_admin: Client, acme: Organization) -> None:
    r = owner_admin.post(
        url("stack", "add"),
        {
            "organization": acme.pk,
            "name": "api",
            "labels": '{"gantry:runner-group:os": "linux"}',
            "spec": json.dumps(SPEC),
            "secrets_update": '{"TOKEN": "t"}',
            "default_priority": "2",
        },
    )
    assert r.status_code == 302
    stack = Stack.objects.get(organization=acme, name="api")
    assert (stack.runner_selector, plain(stack), stack.spec["steps"], stack.default_priority) == (
        {"os": "linux"},
        {"TOKEN": "t"},
        SPEC["steps"],
        Priority.HIGH,
    )


def test_it_refuses_a_bad_spec(owner_admin: Client, stack: Stack) -> None:
    r = owner_admin.post(
        url("stack", "change", stack.pk),
        {"name": "web", "labels": "{}", "spec": '{"steps": [], "timout_seconds": 5}'},
    )
    assert r.status_code == 200
    assert "unknown keys" in str(r.context["adminform"].form.errors["spec"])
    stack.refresh_from_db()
    assert stack.spec["steps"] == SPEC["steps"]


def test_it_refuses_reserved_stack_labels(owner_admin: Client, stack: Stack) -> None:
    r = owner_admin.post(
        url("stack", "change", stack.pk),
        {"name": "web", "labels": '{"gantry:other": "x"}', "spec": json.dumps(stack.spec)},
    )
    assert r.status_code == 200
    assert "labels" in r.context["adminform"].form.errors
    stack.refresh_from_db()
    assert "gantry:other" not in stack.labels


def test_it_refuses_malformed_secret_updates(owner_admin: Client, stack: Stack) -> None:
    r = owner_admin.post(
        url("stack", "change", stack.pk),
        {"name": "web", "labels": "{}", "spec": json.dumps(stack.spec), "secrets_update": '{"N": 5}'},
    )
    assert r.status_code == 200
    assert "secrets_update" in r.context["adminform"].form.errors


def test_it_refuses_a_secret_name_a_shell_cannot_use(owner_admin: Client, stack: Stack) -> None:
    for name in ("1BAD NAME", "PATH", "GANTRY_RUN_ID"):
        r = owner_admin.post(
            url("stack", "change", stack.pk),
            {"name": "web", "labels": "{}", "spec": json.dumps(stack.spec), "secrets_update": json.dumps({name: "v"})},
        )
        assert r.status_code == 200, name
        assert "secrets_update" in r.context["adminform"].form.errors
    assert plain(stack) == {}


def test_it_refuses_a_nul_in_the_spec_with_a_form_error(owner_admin: Client, stack: Stack) -> None:
    spec = {"steps": [{"name": "x", "run": "echo \u0000"}]}
    r = owner_admin.post(url("stack", "change", stack.pk), {"name": "web", "labels": "{}", "spec": json.dumps(spec)})
    assert r.status_code == 200
    assert "NUL" in str(r.context["adminform"].form.errors["spec"])


def test_archived_stacks_leave_the_list_unless_asked(owner_admin: Client, acme: Organization, stack: Stack) -> None:
    gone = services.stack_create(org=acme, name="gone", spec=SPEC)
    services.stack_archive(stack_id=gone.pk)

    def listed(query: dict[str, str]) -> set[str]:
        return {s.name for s in owner_admin.get(url("stack"), query).context["cl"].result_list}

    assert listed({}) == {"web"}
    assert listed({"archived": "yes"}) == {"gone"}
    assert listed({"archived": "all"}) == {"web", "gone"}
