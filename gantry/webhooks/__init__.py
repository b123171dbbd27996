"""Webhooks (docs/webhooks.md): an org's endpoints, the outbox the run effects write, and its delivery.

- ``services``: register, list and delete endpoints (the API and the page call these);
- ``addresses``: the rule that refuses private, loopback and link-local receivers;
- ``delivery``: sign and send what is due, in order per run, with backoff;
- ``tasks``: the Celery task (kicked by ``listener`` on the outbox's NOTIFY, and by beat as a backstop);
- ``management/commands/webhooks``: ``manage.py webhooks --deliver-once``.

The outbox rows themselves are written by gantry.sql.runs (``webhook_ctes``),
in the statement of the transition they report.
"""
