"""``manage.py demo_setup``: the demo organization that ``python3 dev.py run`` starts with.

Creates, once, through the same service functions as the API:

- organization ``demo``, with the admin user (``--admin``) as an org admin;
- runner group ``local`` labelled ``{"os": "linux"}``;
- stack ``hello`` whose runs select that group and print for a few seconds.

Safe to run on every start: what exists is left as it is. The group's token
is printed only when the group is created here; it is never stored, so a
later run can only say how to rotate it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from gantry.core import services
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

    def handle(self, *args: Any, **options: Any) -> None:
        lines: list[str] = []
        # One transaction: a failure half-way leaves nothing, so the next run
        # creates the group again and the token is not lost.
        with transaction.atomic():
            org = Organization.objects.filter(slug=ORG_SLUG).first()
            if org is None:
                org = services.org_create(slug=ORG_SLUG, name=ORG_NAME)
                lines.append(f"organization {ORG_SLUG!r}: created")
            else:
                lines.append(f"organization {ORG_SLUG!r}: exists")

            _, member_created, user_token = services.membership_set(org=org, username=options["admin"], role=Role.ADMIN)
            if member_created:
                lines.append(f"user {options['admin']!r}: made an admin of {ORG_SLUG!r}")
            if user_token:
                lines.append(f"user {options['admin']!r}: created without a password; API token: {user_token}")

            group = RunnerGroup.objects.filter(organization=org, name=GROUP_NAME).first()
            if group is None:
                group, token = services.runner_group_create(org=org, name=GROUP_NAME, labels=GROUP_LABELS)
                lines.append(f"runner group {GROUP_NAME!r} (id {group.id}): created, labels {json.dumps(GROUP_LABELS)}")
                lines.append(f"  group token (shown once; the coordinator authenticates with it): {token}")
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
        # Printed only after the commit: a token shown for a rolled-back group would be useless.
        self.stdout.write("\n".join(lines))
