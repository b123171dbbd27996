"""Organizations, memberships, runner groups and stacks: the objects an org admin manages."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F
from rest_framework.authtoken.models import Token

from gantry.core import specs, tokens
from gantry.core.errors import InvalidRequest, NameTaken, SlugTaken
from gantry.core.models import (
    GroupKind,
    Membership,
    Organization,
    Role,
    RunnerGroup,
    Stack,
)
from gantry.core.services.transitions import (
    notify_claimable,
)


def org_create(*, slug: str, name: str) -> Organization:
    if Organization.objects.filter(slug=slug).exists():
        raise SlugTaken(f"an organization with slug {slug!r} exists")
    return Organization.objects.create(slug=slug, name=name)


def org_update(
    *, org: Organization, name: str | None = None, default_runner_group_id: int | object | None = ...
) -> Organization:
    fields = []
    if name is not None:
        org.name = name
        fields.append("name")
    if default_runner_group_id is not ...:
        if (
            default_runner_group_id is not None
            and not RunnerGroup.objects.filter(
                id=default_runner_group_id,  # type: ignore[misc]
                organization=org,
            ).exists()
        ):
            raise InvalidRequest("default_runner_group_id must name a runner group of this organization")
        org.default_runner_group_id = default_runner_group_id  # type: ignore[assignment]
        fields.append("default_runner_group")
    if fields:
        org.save(update_fields=fields)
        if "default_runner_group" in fields:
            # Empty-selector runs may have become claimable by another group.
            notify_claimable(organization_id=org.id)
    return org


def org_set_runs_per_hour_limit(*, org: Organization, limit: int) -> Organization:
    """Set the org's dispatch rate and drop its deferral stamp in the same write.

    The stamp encodes the refill at the old rate; left in place it would keep
    excluding the org from dispatch after the rate was raised.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidRequest("runs_per_hour_limit must be a whole number, 0 or more")
    Organization.objects.filter(id=org.id).update(runs_per_hour_limit=limit, dispatch_throttled_until=None)
    org.refresh_from_db()
    notify_claimable(organization_id=org.id)
    return org


def membership_set(*, org: Organization, username: str, role: str) -> tuple[Membership, bool, str | None]:
    """Add ``username`` (created if new) to ``org`` with ``role``, or change its role.

    Returns the membership, whether it is new, and an API token when the user
    was created here (so the caller can hand it over once).
    """
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of: {', '.join(Role.values)}")
    if not isinstance(username, str) or not username.strip() or len(username) > 150:
        raise InvalidRequest("username must be a non-empty string of at most 150 characters")
    User = get_user_model()
    with transaction.atomic():
        user, user_created = User.objects.get_or_create(username=username)
        if user_created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        membership, created = Membership.objects.get_or_create(user=user, organization=org, defaults={"role": role})
        if not created and membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
        if role == Role.ADMIN and not user.is_staff:
            # Org admins work in the Django admin too (scoped to their orgs).
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        api_token = Token.objects.create(user=user).key if user_created else None
    return membership, created, api_token


def runner_group_create(*, org: Organization, name: str, **fields: Any) -> tuple[RunnerGroup, str]:
    """Create a group; returns it with its token (shown once, never stored)."""
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    fields.update(specs.validate_github_fields(fields.get("kind") or GroupKind.SELF_HOSTED, fields))
    if RunnerGroup.objects.filter(organization=org, name=name).exists():
        raise NameTaken(f"a runner group named {name!r} exists in this organization")
    group = RunnerGroup.objects.create(organization=org, name=name, **fields)
    return group, tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


def runner_group_update(*, group: RunnerGroup, **fields: Any) -> RunnerGroup:
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    if any(name in fields for name in specs.GITHUB_FIELDS):
        # Checked whole: the group as it will be, not just the fields changed.
        merged = {name: fields.get(name, getattr(group, name)) for name in specs.GITHUB_FIELDS}
        clean = specs.validate_github_fields(group.kind, merged)
        fields.update({name: clean[name] for name in specs.GITHUB_FIELDS if name in fields})
    if (
        "name" in fields
        and RunnerGroup.objects.filter(organization_id=group.organization_id, name=fields["name"])
        .exclude(id=group.id)
        .exists()
    ):
        raise NameTaken(f"a runner group named {fields['name']!r} exists in this organization")
    for key, value in fields.items():
        setattr(group, key, value)
    if fields:
        group.save(update_fields=list(fields))
        # New labels or capacity can make waiting runs claimable.
        notify_claimable(organization_id=group.organization_id)
    return group


def runner_group_rotate_token(*, group: RunnerGroup) -> str:
    """Issue a new group token; every token issued before stops working at once."""
    RunnerGroup.objects.filter(id=group.id).update(token_version=F("token_version") + 1)
    group.refresh_from_db(fields=["token_version"])
    return tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


def runner_group_set_drained(*, group: RunnerGroup, drained: bool) -> RunnerGroup:
    RunnerGroup.objects.filter(id=group.id).update(drained=drained)
    group.refresh_from_db(fields=["drained"])
    if not drained:
        notify_claimable(organization_id=group.organization_id)
    return group


def stack_create(*, org: Organization, name: str, labels: Any = None, spec: Any = None, secrets: Any = None) -> Stack:
    if Stack.objects.filter(organization=org, name=name).exists():
        raise NameTaken(f"a stack named {name!r} exists in this organization")
    return Stack.objects.create(
        organization=org,
        name=name,
        labels=specs.validate_stack_labels(labels or {}),
        spec=specs.validate_spec(spec) if spec else None,
        secrets=_validate_secrets(secrets or {}),
    )


def stack_update(*, stack: Stack, **fields: Any) -> Stack:
    """Change a stack. Existing runs keep the selector they were created with."""
    if "labels" in fields:
        fields["labels"] = specs.validate_stack_labels(fields["labels"])
    if "spec" in fields:
        fields["spec"] = specs.validate_spec(fields["spec"]) if fields["spec"] else None
    if "secrets" in fields:
        fields["secrets"] = _validate_secrets(fields["secrets"])
    if (
        "name" in fields
        and Stack.objects.filter(organization_id=stack.organization_id, name=fields["name"])
        .exclude(id=stack.id)
        .exists()
    ):
        raise NameTaken(f"a stack named {fields['name']!r} exists in this organization")
    for key, value in fields.items():
        setattr(stack, key, value)
    if fields:
        stack.save(update_fields=list(fields))
    return stack


def _validate_secrets(secrets: Any) -> dict[str, str]:
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise InvalidRequest("secrets must map strings to strings")
    return dict(secrets)
