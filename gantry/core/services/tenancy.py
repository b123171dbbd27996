"""Organizations, memberships, runner groups and stacks: the objects an org admin manages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import F, Model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from gantry.core import secrets as stack_secrets
from gantry.core import specs, tokens
from gantry.core.errors import GroupBusy, InvalidRequest, NameTaken, NotFound, SlugTaken, StackArchived
from gantry.core.models import (
    RUNNER_BOUND,
    GroupKind,
    Invitation,
    Membership,
    Organization,
    Priority,
    Role,
    Run,
    Runner,
    RunnerGroup,
    Stack,
)
from gantry.core.services import members
from gantry.core.services.transitions import (
    notify_claimable,
)

M = TypeVar("M", bound=Model)


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
                archived_at__isnull=True,
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


@dataclass(frozen=True)
class MemberChange:
    """What ``membership_set`` did: a membership (new or changed) or, for someone who already has an
    account, an invitation they must accept; and, for a user it created, an API token and a set-password link."""

    membership: Membership | None
    invitation: Invitation | None
    created: bool
    api_token: str | None = None
    password_link: members.PasswordLink | None = None


def membership_set(
    *,
    org: Organization,
    username: str,
    role: str,
    by: User | None = None,
    invite_existing: bool = True,
    email: str = "",
) -> MemberChange:
    """Add ``username`` to ``org`` with ``role``, or change a member's role.

    An unknown username becomes a new user (no password yet: the answer's
    link sets one) and a member at once. An existing user who is not a
    member is *invited* (members.py): nobody is attached to an org without
    their consent. ``invite_existing=False`` is for an operator's own command
    (``demo_setup``), where the consent is the operator's. ``email`` is a new
    user's email (before the link is made: Django's token hashes it).
    """
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of: {', '.join(Role.values)}")
    if not isinstance(username, str) or not username.strip() or len(username) > 150:
        raise InvalidRequest("username must be a non-empty string of at most 150 characters")
    try:
        # Django's own rule (letters, digits and @ . + - _): no control or bidirectional-override characters.
        User.username_validator(username)
    except ValidationError:
        raise InvalidRequest("username may contain only letters, digits and @ . + - _", field="username") from None
    with transaction.atomic():
        user = User.objects.filter(username=username).first()
        if user is None:
            # No password: unusable until the link sets one.
            user = User.objects.create_user(username=username, email=email)
            membership, _ = members.grant(org=org, user=user, role=role)
            return MemberChange(
                membership=membership,
                invitation=None,
                created=True,
                api_token=Token.objects.create(user=user).key,
                password_link=members.password_link(user),
            )
        if invite_existing and not Membership.objects.filter(user=user, organization=org).exists():
            return MemberChange(
                membership=None, invitation=members.invitation_set(org=org, user=user, role=role, by=by), created=False
            )
        membership, created = members.grant(org=org, user=user, role=role)
    return MemberChange(membership=membership, invitation=None, created=created)


def membership_invite(*, org: Organization, who: str, role: str, by: User) -> MemberChange:
    """The members page's invite: ``who`` is a username or an email address.

    An email of an existing account (``User.email``, any case) invites that
    account, as ``membership_set`` does for a username. An email nobody has
    becomes a new user named by it (Django's username rule allows ``@ . + -
    _``), with that email, a member at once with a set-password link.
    """
    who = who.strip()
    if "@" in who:
        try:
            validate_email(who)
        except ValidationError:
            raise InvalidRequest(f"{who!r} is not an email address", field="who") from None
        known = list(User.objects.filter(email__iexact=who).values_list("username", flat=True)[:2])
        if len(known) > 1:
            raise InvalidRequest("more than one account has that email: invite by username", field="who")
        if known:
            return membership_set(org=org, username=known[0], role=role, by=by)
        return membership_set(org=org, username=who, role=role, by=by, email=who)
    return membership_set(org=org, username=who, role=role, by=by)


def runner_group_create(*, org: Organization, name: str, **fields: Any) -> tuple[RunnerGroup, str]:
    """Create a group; returns it with its token (shown once, never stored)."""
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    fields.update(specs.validate_github_fields(fields.get("kind") or GroupKind.SELF_HOSTED, fields))
    check_name_free(RunnerGroup, organization_id=org.id, name=name)
    group = _create_named(RunnerGroup, "runner group", organization=org, name=name, **fields)
    return group, tokens.mint_group_token(
        group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
    )


def runner_group_update(*, group: RunnerGroup, **fields: Any) -> RunnerGroup:
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    if any(name in fields for name in specs.GITHUB_FIELDS):
        # Checked whole: the group as it will be, not just the fields changed.
        merged = {name: fields.get(name, getattr(group, name)) for name in specs.GITHUB_FIELDS}
        clean = specs.validate_github_fields(group.kind, merged)
        fields.update({name: clean[name] for name in specs.GITHUB_FIELDS if name in fields})
    if "name" in fields:
        check_name_free(RunnerGroup, organization_id=group.organization_id, name=fields["name"], other_than=group.id)
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
    return tokens.mint_group_token(
        group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
    )


def runner_group_set_drained(*, group: RunnerGroup, drained: bool) -> RunnerGroup:
    RunnerGroup.objects.filter(id=group.id).update(drained=drained)
    group.refresh_from_db(fields=["drained"])
    if not drained:
        notify_claimable(organization_id=group.organization_id)
    return group


def runner_group_archive(*, group: RunnerGroup, now: datetime | None = None) -> RunnerGroup:
    """Archive a group (DELETE /runner-groups/{id}): its tokens stop at once, it leaves lists and the claim.

    Refused with GroupBusy while a runner of it holds a run (assigned or
    executing): archiving would strand that run until a reaper. Its runs and
    their history stay readable; its idle runner rows (no run bound) go.

    Race-safe against a claim: the group row is locked FOR UPDATE, which waits
    for a claim holding its FOR NO KEY UPDATE (that claim's stub is then seen
    below, and the archive refused), and makes a later claim wait for this
    commit and read archived_at on the row version written here (gantry.sql.claim
    ``has_room``: it claims nothing). The token version is bumped in the same
    write, so every group token, the fast lane's included, is refused (401).
    """
    now = now or timezone.now()
    with transaction.atomic():
        locked = RunnerGroup.objects.select_for_update().filter(id=group.id, archived_at__isnull=True).first()
        if locked is None:
            raise NotFound("runner group not found")
        busy = (
            Run.objects.filter(assigned_runner__runner_group_id=group.id, status__in=sorted(RUNNER_BOUND))
            .values_list("id", flat=True)
            .first()
        )
        if busy is not None:
            raise GroupBusy(
                f"runner group {group.name!r} holds run {busy}: archive it once its runs have finished "
                "(drain the group first so it takes no new one)",
                run_id=str(busy),
            )
        # None of these is bound to a run (checked above under the lock): a
        # pending run still pointing at one is released by the key's SET NULL.
        Runner.objects.filter(runner_group_id=group.id).delete()
        RunnerGroup.objects.filter(id=group.id).update(archived_at=now, token_version=F("token_version") + 1)
        # An archived default would keep the org's selector-less runs waiting for ever.
        if Organization.objects.filter(id=group.organization_id, default_runner_group_id=group.id).update(
            default_runner_group=None
        ):
            notify_claimable(organization_id=group.organization_id)
    group.refresh_from_db(fields=["archived_at", "token_version", "runner_count"])
    return group


def stack_create(
    *,
    org: Organization,
    name: str,
    labels: Any = None,
    spec: Any = None,
    secrets: Any = None,
    default_priority: int = Priority.NORMAL,
) -> Stack:
    check_name_free(Stack, organization_id=org.id, name=name)
    return _create_named(
        Stack,
        "stack",
        organization=org,
        name=name,
        labels=specs.validate_stack_labels(labels or {}),
        spec=specs.validate_spec(spec) if spec is not None else None,
        secrets=stack_secrets.seal(specs.validate_secrets(secrets or {})),
        default_priority=default_priority,
    )


def stack_update(*, stack: Stack, **fields: Any) -> Stack:
    """Change a stack. Existing runs keep the selector they were created with. An archived stack is not changed."""
    if stack.archived_at is not None:
        raise StackArchived("the stack is archived: it cannot be changed", archived_at=stack.archived_at.isoformat())
    if "labels" in fields:
        fields["labels"] = specs.validate_stack_labels(fields["labels"])
    if "spec" in fields:
        fields["spec"] = specs.validate_spec(fields["spec"]) if fields["spec"] is not None else None
    if "secrets" in fields:
        fields["secrets"] = stack_secrets.seal(specs.validate_secrets(fields["secrets"]))
    if "name" in fields:
        check_name_free(Stack, organization_id=stack.organization_id, name=fields["name"], other_than=stack.id)
    for key, value in fields.items():
        setattr(stack, key, value)
    if fields:
        stack.save(update_fields=list(fields))
    return stack


def stack_set_secrets(*, stack: Stack, changes: dict[str, str | None]) -> Stack:
    """Set some of a stack's secrets (name → value) and remove others (name → None); the rest stay as they are.

    The admin's form takes changes only, since stored values are never shown.
    """
    kept = {name: token for name, token in stack.secrets.items() if name not in changes}
    new = specs.validate_secrets({name: value for name, value in changes.items() if value is not None})
    stack.secrets = {**kept, **stack_secrets.seal(new)}
    stack.save(update_fields=["secrets"])
    return stack


def check_name_free(
    model: type[RunnerGroup] | type[Stack], *, organization_id: int, name: str, other_than: int | None = None
) -> None:
    """The one rule of a runner group's or stack's name: unique among its org's live rows, ignoring case.

    ``NameTaken`` otherwise. Archived rows keep their names but no longer hold
    them (the partial unique indexes ``*_org_name_ci_uniq``, which stand behind
    this check for a concurrent create: :func:`_create_named`). ``other_than``:
    the row being renamed.
    """
    taken = model._default_manager.filter(organization_id=organization_id, name__iexact=name, archived_at__isnull=True)
    if other_than is not None:
        taken = taken.exclude(pk=other_than)
    if taken.exists():
        raise NameTaken(f"a {model._meta.verbose_name} named {name!r} exists in this organization (names ignore case)")


def _create_named(model: type[M], noun: str, **fields: Any) -> M:
    """Create a named row; a concurrent create of the same name (any case) is NameTaken, not a 500."""
    try:
        with transaction.atomic():
            return model._default_manager.create(**fields)
    except IntegrityError as exc:
        if "_name_ci_uniq" not in str(exc):
            raise
        raise NameTaken(f"a {noun} named {fields['name']!r} exists in this organization (names ignore case)") from None
