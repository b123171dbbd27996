"""Redis holds nothing authoritative: emptied in the middle of a run, the run still finishes with its whole log.

docs/operations.md ("What is lost when Redis is lost") says a flushed Redis
costs an executing run only the live view of its unsealed output, until the
runner's next push, and that the run's log is complete once it finishes
(the last chunk is sealed and uploaded before /done). This plays it with
tests/e2e's real processes: the server's Redis database is emptied (FLUSHDB)
while a step is blocked after printing, then the step goes on.
"""

from __future__ import annotations

import pytest
import redis

from gantry.logs import live
from tests.e2e import conftest as e2e
from tests.e2e.conftest import Lab, wait_until

pytestmark = pytest.mark.e2e

server = e2e.server
moto_s3 = e2e.moto_s3
lab = e2e.lab


def test_a_run_survives_redis_being_emptied_mid_run(lab: Lab) -> None:
    lab.coordinator()
    go = lab.tmp / "go"
    run_id = lab.deploy(
        [
            {"name": "first", "run": f"echo before the flush; while [ ! -e {go} ]; do sleep 0.1; done"},
            {"name": "second", "run": "echo after the flush"},
        ]
    )
    # The unsealed output is readable only through its live record in Redis.
    wait_until(lambda: "before the flush" in lab.log_so_far(run_id), 60, "the live log to show the first step")
    client = redis.Redis.from_url(lab.server.env["REDIS_URL"])
    try:
        assert client.exists(live.KEY.format(run_id=run_id)) == 1  # what the flush destroys was there
        client.flushdb()
    finally:
        client.close()
    go.touch()

    # The runner's next push puts the live view back, then the run ends with its whole log.
    wait_until(lambda: "after the flush" in lab.log_so_far(run_id), 60, "the live log to come back")
    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    text, _ = lab.read_log(run_id)
    assert "==> [1/2] first\nbefore the flush\n==> [1/2] first: exit code 0" in text, text
    assert "==> [2/2] second\nafter the flush\n==> [2/2] second: exit code 0" in text, text

    # Dispatch, the long poll and the protocol need nothing Redis held: the next run goes through too.
    second = lab.deploy([{"name": "again", "run": "echo again"}])
    assert lab.wait_terminal(second)["status"] == "succeeded"
