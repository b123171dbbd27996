"""The API client's retries, against a tiny HTTP server of the test's own (no Django).

The server answers from a script (a list of (status, body, headers) answers),
so each test states exactly what the client meets: 503s then a 200, a 4xx,
a 429 with Retry-After, a connection that is refused.
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gantry_wire import protocol
from runners.client import (
    READY_RETRY,
    ApiError,
    Backoff,
    GantryClient,
    RequestAborted,
    RetryPolicy,
    ServerUnreachable,
    Upload,
)
from runners.coordinator import identity_headers

Answer = tuple[int, Any, dict[str, str]]


class Scripted(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answers: list[Answer]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers = answers
        self.requests: list[dict[str, Any]] = []
        self.hold = threading.Event()  # set: the next request blocks until released
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        if self.server.hold.is_set():
            self.server.release.wait(10)
        status, payload, headers = self.server.answers.pop(0) if self.server.answers else (200, {}, {})
        data = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Scripted]:
    srv = Scripted([])
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client_for(server: Scripted, sleeps: Sleeps, **kwargs: Any) -> GantryClient:
    return GantryClient(server.url, "jwt-abc", timeout=5, sleep=sleeps, **kwargs)


def test_it_retries_5xx_with_growing_jittered_backoff_then_succeeds(server: Scripted) -> None:
    server.answers = [(503, {"code": "unavailable", "detail": "db"}, {})] * 3 + [(200, {"status": "running"}, {})]
    sleeps = Sleeps()
    client = client_for(server, sleeps, retry=RetryPolicy(attempts=5, base=0.5, cap=10))

    assert client.status("r1") == {"status": "running"}
    assert len(server.requests) == 4
    assert len(sleeps) == 3
    # Full jitter: each pause is within its exponential ceiling.
    for attempt, pause in enumerate(sleeps, 1):
        assert 0 <= pause <= 0.5 * 2 ** (attempt - 1)
    assert server.requests[0]["headers"]["Authorization"] == "Bearer jwt-abc"


def test_it_gives_up_after_the_attempts_with_the_last_error(server: Scripted) -> None:
    server.answers = [(502, b"<html>bad gateway</html>", {})] * 3
    sleeps = Sleeps()
    client = client_for(server, sleeps, retry=RetryPolicy(attempts=3))

    with pytest.raises(ApiError) as info:
        client.status("r1")
    assert info.value.status == 502
    assert info.value.code == "http_502"
    assert "bad gateway" in info.value.detail
    assert info.value.transient
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_it_never_retries_a_4xx_and_carries_the_contract_code(server: Scripted, status: int) -> None:
    server.answers = [(status, {"code": "run_already_terminal", "detail": "run is discarded"}, {})]
    sleeps = Sleeps()
    client = client_for(server, sleeps)

    with pytest.raises(ApiError) as info:
        client.accept("r1")
    assert (info.value.status, info.value.code, info.value.detail) == (
        status,
        "run_already_terminal",
        "run is discarded",
    )
    assert not info.value.transient
    assert len(server.requests) == 1
    assert sleeps == []


def test_it_retries_a_429_after_its_retry_after(server: Scripted) -> None:
    server.answers = [(429, {"code": "throttled", "detail": "slow down"}, {"Retry-After": "3"}), (204, None, {})]
    sleeps = Sleeps()
    client = client_for(server, sleeps)

    client.acknowledge_cancel("r1")
    assert sleeps == [3.0]
    assert len(server.requests) == 2


def test_ready_keeps_trying_for_30_seconds_of_transient_errors(server: Scripted) -> None:
    server.answers = [(503, {"code": "x", "detail": "y"}, {})] * 1000
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    client = GantryClient(server.url, "jwt", sleep=sleep)
    # Time is the sleeps: the deadline bounds the total pause.
    import runners.client as module

    real = module.time.monotonic
    module.time.monotonic = lambda: clock[0]  # type: ignore[assignment]
    try:
        with pytest.raises(ApiError) as info:
            client.ready("runner-1", pid=42)
    finally:
        module.time.monotonic = real  # type: ignore[assignment]
    assert info.value.status == 503
    assert clock[0] == pytest.approx(READY_RETRY.deadline)
    assert len(server.requests) > 5
    assert json.loads(server.requests[0]["body"]) == {"pid": 42}


def test_ready_is_not_retried_on_a_conflict(server: Scripted) -> None:
    server.answers = [(409, {"code": "runner_busy", "detail": "accepted already"}, {})]
    client = client_for(server, Sleeps())
    with pytest.raises(ApiError) as info:
        client.ready("runner-1")
    assert info.value.code == "runner_busy"
    assert len(server.requests) == 1


def test_an_unreachable_server_is_retried_then_reported_as_such() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens here
    sleeps = Sleeps()
    client = GantryClient(f"http://127.0.0.1:{port}", "jwt", timeout=2, sleep=sleeps, retry=RetryPolicy(attempts=4))

    with pytest.raises(ServerUnreachable) as info:
        client.status("r1")
    assert info.value.status == 0
    assert info.value.code == "unreachable"
    assert info.value.transient
    assert len(sleeps) == 3


def test_poll_answers_a_claim_or_none_and_is_not_retried(server: Scripted) -> None:
    claim = {"run_id": "r", "runner_id": "u", "runner_token": "t", "assigned_expires_at": "2030-01-01T00:00:00Z"}
    server.answers = [(204, None, {}), (200, claim, {}), (503, {"code": "x", "detail": "down"}, {})]
    client = client_for(server, Sleeps())

    assert client.poll(wait=0) is None
    got = client.poll(wait=5)
    assert got is not None
    assert (got.run_id, got.runner_id, got.runner_token) == ("r", "u", "t")
    assert server.requests[1]["path"] == "/api/v1/runner-groups/poll?wait=5"
    with pytest.raises(ApiError):
        client.poll(wait=0)
    assert len(server.requests) == 3


def test_abort_cuts_off_a_parked_poll(server: Scripted) -> None:
    server.hold.set()
    client = client_for(server, Sleeps())
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            client.poll(wait=30)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    pause = threading.Event()
    for _ in range(3000):  # a hang guard of 30 s, not a figure
        if server.requests:
            break
        pause.wait(0.01)
    assert server.requests, "hang guard: the poll had not reached the server after 30 s"
    client.abort()
    thread.join(60)  # a hang guard; the property is the RequestAborted (held, the server answers after 10 s)
    assert not thread.is_alive(), "hang guard: the poll was still waiting 60 s after abort()"
    assert len(errors) == 1
    assert isinstance(errors[0], RequestAborted)


def test_put_chunk_resolves_a_relative_url_and_sends_no_token(server: Scripted) -> None:
    server.answers = [(200, b"", {})]
    client = GantryClient(server.url + "/", "jwt-secret")

    client.put_chunk(Upload(url="/api/v1/log-uploads/signed-xyz", headers={"Content-Type": "application/gzip"}), b"gz")
    sent = server.requests[0]
    assert sent["method"] == "PUT"
    assert sent["path"] == "/api/v1/log-uploads/signed-xyz"
    assert sent["body"] == b"gz"
    assert sent["headers"]["Content-Type"] == "application/gzip"
    assert "Authorization" not in sent["headers"]


def test_put_chunk_keeps_an_absolute_presigned_url(server: Scripted) -> None:
    server.answers = [(200, b"", {})]
    client = GantryClient("http://gantry.invalid:9", "jwt")
    client.put_chunk(Upload(url=f"{server.url}/bucket/runs/x/chunks/00000000.gz?X-Amz-Signature=abc"), b"gz")
    assert server.requests[0]["path"] == "/bucket/runs/x/chunks/00000000.gz?X-Amz-Signature=abc"


def test_done_sends_the_manifest(server: Scripted) -> None:
    server.answers = [(204, None, {})]
    client = client_for(server, Sleeps())
    client.done("r1", outcome="failure", exit_code=3, sealed_chunks=2, manifest={"count": 2, "sha256": ["a", "b"]},
                error="step 1 failed")  # fmt: skip
    assert json.loads(server.requests[0]["body"]) == {
        "outcome": "failure",
        "exit_code": 3,
        "sealed_chunks": 2,
        "manifest": {"count": 2, "sha256": ["a", "b"]},
        "error": "step 1 failed",
    }


def test_a_user_client_uses_the_token_scheme(server: Scripted) -> None:
    server.answers = [(200, {"text": "hi\n", "next_offset": 3, "complete": True}, {})]
    client = GantryClient(server.url, "user-key", scheme="Token")
    assert client.run_logs("r1", offset=0) == {"text": "hi\n", "next_offset": 3, "complete": True}
    assert server.requests[0]["headers"]["Authorization"] == "Token user-key"
    assert server.requests[0]["path"] == "/api/v1/runs/r1/logs?offset=0"


def test_backoff_doubles_from_base_to_cap_and_keeps_the_policys_floor() -> None:
    policy = RetryPolicy(attempts=sys.maxsize, base=1.0, cap=8.0, floor=0.5)
    backoff = Backoff(policy)
    pauses = [backoff.failed() for _ in range(6)]
    ceilings = [1, 2, 4, 8, 8, 8]
    assert all(c / 2 <= p <= c for p, c in zip(pauses, ceilings, strict=True)), pauses
    assert backoff.failures == 6
    backoff.succeeded()
    assert backoff.failures == 0
    assert 0.5 <= backoff.failed() <= 1


def test_a_loop_failing_for_hours_still_gets_a_bounded_pause() -> None:
    policy = RetryPolicy(attempts=sys.maxsize, base=1.0, cap=30.0, floor=0.5)
    assert 15 <= policy.delay(100_000) <= 30


def test_full_jitter_stays_the_default_for_a_requests_retries() -> None:
    pauses = {RetryPolicy(base=1.0, cap=1.0).delay(1) for _ in range(200)}
    assert min(pauses) < 0.5  # drawn from [0, 1]: a retry may follow at once


def test_poll_sends_the_coordinators_identity_headers(server: Scripted) -> None:
    server.answers = [(204, None, {})]
    client = client_for(server, Sleeps())
    client.poll_headers = identity_headers("c0ffee", host="build 1.exämple")

    client.poll(wait=0)

    sent = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert sent["x-gantry-coordinator-id"] == "c0ffee"
    assert sent["x-gantry-coordinator-host"] == "build1.exmple"  # only what the server accepts
    assert sent["x-gantry-coordinator-version"] == protocol.VERSION
