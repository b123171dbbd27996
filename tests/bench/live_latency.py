"""Live output latency: a line written by a step → the same line readable by a following reader (docs/logs.md).

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.live_latency [--runs 4] [--lines 30] [--mode asgi|gthread]

A real server (tests/bench/lifecycle.py's :data:`SERVER_MODES`, gantry.asgi by
default), a real coordinator with the local launcher, and for each run a step
that prints ``--lines`` lines, each carrying the wall clock it was written at
(``date +%s%N``), with pauses of 0.05-0.6 s between them. A reader follows each
run as the page does (``GET /runs/{id}/logs?wait=25`` from ``next_offset``) and
notes, for every line, when it became readable. Reported: p50/p90/p99/max of
written → readable. It is a measurement, not a
test: it exits 0 either way. Runs go one after another, so a run's start-up is
not in the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute
from tests.bench.lifecycle import ROOT, SERVER_MODES, Server

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_live_latency"
MARK = "LAT "


def step_script(lines: int, rng: random.Random) -> str:
    parts = []
    for _ in range(lines):
        parts.append(f'echo "{MARK}$(date +%s%N)"')
        parts.append(f"sleep {rng.uniform(0.05, 0.6):.2f}")
    return "; ".join(parts)


def setup(lines: int, runs: int, seed: int) -> tuple[int, str, str, list[str]]:
    """A fresh org, its group, a member's API token and one stack per run; answers (group id, group token,
    user token, stack ids)."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from gantry.core import services, tokens
    from gantry.core.models import SELECTOR_PREFIX, Membership, Organization, Role

    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, organization, "
        "membership, authtoken_token, auth_user CASCADE"
    )
    org = Organization.objects.create(slug="bench-live", name="bench")
    group, _ = services.runner_group_create(org=org, name="bench", labels={"os": "linux"}, max_concurrent_runs=8)
    user = User.objects.create_user(username="bench-reader")
    Membership.objects.create(user=user, organization=org, role=Role.MEMBER)
    rng = random.Random(seed)
    stacks = []
    for i in range(runs):
        spec = {"steps": [{"name": "lines", "run": step_script(lines, rng)}]}
        stack = services.stack_create(org=org, name=f"live-{i}", labels={SELECTOR_PREFIX + "os": "linux"}, spec=spec)
        stacks.append(str(stack.id))
    group_token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    return group.id, group_token, Token.objects.create(user=user).key, stacks


def follow(port: int, token: str, run_id: str, deadline: float) -> tuple[list[float], bool]:
    """Follows the run's log to its end; (written → readable seconds per marked line, whether it ended)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    offset, partial, lags = 0, "", []
    try:
        while time.monotonic() < deadline:
            conn.request("GET", f"/api/v1/runs/{run_id}/logs?wait=25&offset={offset}",
                         headers={"Authorization": f"Token {token}"})  # fmt: skip
            page = json.loads(conn.getresponse().read())
            now_ns = time.time_ns()
            text = partial + page["text"]
            *done, partial = text.split("\n")
            lags += [(now_ns - int(line[len(MARK) :])) / 1e9 for line in done if line.startswith(MARK)]
            offset = page["next_offset"]
            if page["final"]:
                return lags, True
    finally:
        conn.close()
    return lags, False


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=4, help="runs, one after another (default 4)")
    parser.add_argument("--lines", type=int, default=30, help="marked lines per run (default 30)")
    parser.add_argument("--mode", choices=sorted(SERVER_MODES), default="asgi", help="a production server mode")
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args(argv)

    url = database_url(DEFAULT_DATABASE_URL)
    bootstrap(url)
    from django.conf import settings

    from gantry.core import services
    from gantry.core.models import Run, Stack

    _, group_token, user_token, stacks = setup(args.lines, args.runs, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="gantry-live-latency-"))
    env = {
        "DATABASE_URL": url,
        "REDIS_URL": os.environ["REDIS_URL"],
        "GANTRY_REDIS_DB": os.environ["GANTRY_REDIS_DB"],
        "GANTRY_SECRET_KEY": settings.SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "gantry.settings",
        "GANTRY_LOG_DIR": str(tmp / "logs"),
        "GANTRY_RATE_LIMIT_ENABLED": "false",
    }
    server = Server(SERVER_MODES[args.mode], env)
    coordinator_env = {**os.environ, "GANTRY_GROUP_TOKEN": group_token, "GANTRY_LOG_LEVEL": "WARNING"}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "runners.coordinator", "--server", f"http://127.0.0.1:{server.port}",
         "--launcher", "local", "--state-dir", str(tmp / "state"), "--max-parallel", "2", "--wait", "10"],
        cwd=ROOT, env=coordinator_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    lags: list[float] = []
    try:
        for stack_id in stacks:
            deployment = services.deployment_create(stack=Stack.objects.get(id=stack_id))
            run = Run.objects.get(deployment=deployment)
            got, ended = follow(server.port, user_token, str(run.id), time.monotonic() + 120)
            if not ended:
                print(f"run {run.id} did not end within 120 s", flush=True)
            lags += got
            print(f"run {run.id}: {len(got)} lines, p50 {statistics.median(got) * 1000:.0f} ms, "
                  f"max {max(got) * 1000:.0f} ms", flush=True)  # fmt: skip
    finally:
        coordinator.terminate()
        try:
            coordinator.wait(30)
        except subprocess.TimeoutExpired:
            coordinator.kill()
        server.stop()

    database = unquote(urlsplit(url).path.lstrip("/"))
    print(f"\nserver: {server.command} (database {database}); {args.runs} runs x {args.lines} lines, pauses "
          "0.05-0.6 s, one run at a time\n")  # fmt: skip
    print("| lines | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    print(f"| {len(lags)} | {pct(lags, 0.5) * 1000:.0f} | {pct(lags, 0.9) * 1000:.0f} | "
          f"{pct(lags, 0.99) * 1000:.0f} | {max(lags) * 1000:.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
