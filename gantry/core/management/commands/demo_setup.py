"""``manage.py demo_setup``: the demo organization that ``python3 dev.py run`` starts with.

Creates, once, through the same service functions as the API:

- organization ``demo``, with the admin user (``--admin``) as an org admin;
- runner group ``local`` labelled ``{"os": "linux"}``;
- stack ``hello`` whose runs select that group and print for a few seconds.

Safe to run on every start: what exists is left as it is. The group's token
is printed only when the group is created here; it is never stored, so a
later run can only say how to rotate it.

``--token-file PATH`` is for ``dev.py run``, which starts the demo's
coordinator itself: the group token goes to that file (mode 0600) instead of
the terminal, and a later run reuses it while it is still valid, or rotates
the token and writes the new one when the file is missing or its token was
revoked (a rotation from the admin, say).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from gantry.core import services, tokens
from gantry.core.models import Organization, Role, RunnerGroup, Stack

ORG_SLUG = "demo"
ORG_NAME = "Demo"
GROUP_NAME = "local"
GROUP_LABELS = {"os": "linux"}
STACK_NAME = "hello"
STACK_LABELS = {"gantry:runner-group:os": "linux"}
# A few seconds of output, so the live log and the queue page have something to show.
STACK_SPEC: dict[str, Any] = {
    "steps": [
        {"name": "hello", "run": 'echo "hello from Gantry on $(uname -n)"'},
        {"name": "count", "run": 'for i in 1 2 3 4 5; do echo "step $i of 5"; sleep 1; done'},
        {"name": "goodbye", "run": 'echo "$GREETING, done"'},
    ],
    "env": {"GREETING": "bye"},
    "timeout_seconds": 300,
}


class Command(BaseCommand):
    help = "Create the demo organization, runner group and stack (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--admin",
            default=os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin",
            help="user made an admin of the demo org (created without a password if missing; "
            "default: $DJANGO_SUPERUSER_USERNAME or admin)",
        )
        parser.add_argument(
            "--token-file",
            metavar="PATH",
            help="keep the demo group's token in this file (0600), rotating it when the file is missing or stale, "
            "instead of printing it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        lines: list[str] = []
        token_file: str | None = options.get("token_file")
        new_token: str | None = None
        # One transaction: a failure half-way leaves nothing, so the next run
        # creates the group again and the token is not lost.
        with transaction.atomic():
            org = Organization.objects.filter(slug=ORG_SLUG).first()
            if org is None:
                org = services.org_create(slug=ORG_SLUG, name=ORG_NAME)
                lines.append(f"organization {ORG_SLUG!r}: created")
            else:
                lines.append(f"organization {ORG_SLUG!r}: exists")

            # The operator's own command: no invitation for the admin user to accept.
            change = services.membership_set(org=org, username=options["admin"], role=Role.ADMIN, invite_existing=False)
            if change.created:
                lines.append(f"user {options['admin']!r}: made an admin of {ORG_SLUG!r}")
            if change.api_token:
                lines.append(f"user {options['admin']!r}: created without a password; API token: {change.api_token}")

            group = RunnerGroup.objects.filter(organization=org, name=GROUP_NAME).first()
            if group is None:
                group, token = services.runner_group_create(org=org, name=GROUP_NAME, labels=GROUP_LABELS)
                lines.append(f"runner group {GROUP_NAME!r} (id {group.id}): created, labels {json.dumps(GROUP_LABELS)}")
                if token_file:
                    new_token = token
                    lines.append(f"  group token written to {token_file}")
                else:
                    lines.append(f"  group token (shown once; the coordinator authenticates with it): {token}")
            elif token_file:
                if _valid_token(token_file, group):
                    lines.append(
                        f"runner group {GROUP_NAME!r} (id {group.id}): exists; its token in {token_file} is valid"
                    )
                else:
                    new_token = services.runner_group_rotate_token(group=group)
                    lines.append(
                        f"runner group {GROUP_NAME!r} (id {group.id}): exists; token rotated, written to {token_file}"
                    )
            else:
                lines.append(
                    f"runner group {GROUP_NAME!r} (id {group.id}): exists; its token was shown when it was created. "
                    f"For a new one (the old one stops working): POST /api/v1/runner-groups/{group.id}/rotate-token"
                )

            stack = Stack.objects.filter(organization=org, name=STACK_NAME).first()
            if stack is None:
                stack = services.stack_create(org=org, name=STACK_NAME, labels=STACK_LABELS, spec=STACK_SPEC)
                lines.append(f"stack {STACK_NAME!r} (id {stack.id}): created, runs select {json.dumps(GROUP_LABELS)}")
            else:
                lines.append(f"stack {STACK_NAME!r} (id {stack.id}): exists")
        # Written and printed only after the commit: a token of a rolled-back group would be useless.
        if token_file and new_token:
            _write_secret(Path(token_file), new_token)
        self.stdout.write("\n".join(lines))


def _valid_token(path: str, group: RunnerGroup) -> bool:
    """The file holds a token of this group at its current version (not rotated away since)."""
    try:
        claims = tokens.decode(Path(path).read_text().strip())
    except (OSError, tokens.TokenInvalid):
        return False
    return (
        claims.audience == tokens.AUD_GROUP
        and claims.subject == str(group.id)
        and claims.raw.get("ver") == group.token_version
    )


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Created 0600 from the start: the token is never readable by others, not even for a moment.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
