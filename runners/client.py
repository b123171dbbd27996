"""A small HTTP client for Gantry's API (docs/protocol.md, docs/logs.md).

Standard library only: runner hosts install nothing else. The transport is
a small HTTP/1.1 client on a socket (:func:`_request_bytes`, :func:`_read_answer`), not ``http.client``:
importing that (and the ``email`` package it parses headers with) was a
quarter of an ephemeral runner's start-up (docs/runners.md, "Start-up").
``ssl`` is imported only for an https URL. One connection per request
(``Connection: close``) keeps the client trivially thread-safe (the ephemeral
runner calls it from its main, status and log threads at once); the request
rates involved (a poll per 30 s, a status per 5 s, a chunk per MiB of output)
make connection reuse irrelevant.

Retries: connection errors, 5xx and 429 are retried with exponential backoff
and full jitter, within a bounded number of attempts and an optional overall
deadline. A 4xx is never retried (it is an answer, not an accident), with the
one exception of 429 (honouring ``Retry-After``). Every error surfaces as
:class:`ApiError` carrying the contract's ``code``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.parse

from gantry_wire.record import Frozen, Record

# Start-up (docs/runners.md): typing, base64 and random are not loaded before a runner's ready.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

USER_AGENT = "gantry-runner/1"


class ApiError(Exception):
    """The server refused a request (``status`` ≥ 400), or could not be reached (``status`` 0)."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {detail}" if status else f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body

    @property
    def transient(self) -> bool:
        """Worth trying again later: unreachable, a server error, or rate limited."""
        return self.status == 0 or self.status >= 500 or self.status == 429


class ServerUnreachable(ApiError):
    """No HTTP answer at all: connection refused or reset, DNS, timeout."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, "unreachable", detail)


class RequestAborted(ApiError):
    """The request was cut off by :meth:`GantryClient.abort` (a daemon shutting down)."""

    def __init__(self) -> None:
        super().__init__(0, "aborted", "request aborted")


class RetryPolicy(Frozen):
    """Exponential backoff with jitter: try ``attempts`` times, never past ``deadline`` seconds.

    The n-th pause is drawn from ``[floor * c, c]`` where ``c = min(cap, base * 2 ** (n - 1))``.
    ``floor`` 0 is full jitter (a request's retries: spread, and the first may
    follow at once); a daemon's loop keeps half (``floor`` 0.5), so a failing
    server or launcher is never hammered by a pause drawn near zero.
    """

    __slots__ = ("attempts", "base", "cap", "deadline", "floor")
    attempts: int
    base: float
    cap: float
    deadline: float | None
    floor: float

    def __init__(
        self, attempts: int = 5, base: float = 0.5, cap: float = 10.0, deadline: float | None = None, floor: float = 0.0
    ) -> None:
        self._set(attempts=attempts, base=base, cap=cap, deadline=deadline, floor=floor)

    def delay(self, attempt: int) -> float:
        """The pause before try number ``attempt + 1`` (``attempt`` counts from 1)."""
        # The exponent is bounded: a loop failing for hours counts thousands of attempts.
        ceiling = min(self.cap, self.base * 2 ** min(max(attempt - 1, 0), 62))
        import random  # here: not needed before a runner's ready (docs/runners.md, Start-up)

        return ceiling * self.floor + random.uniform(0, ceiling * (1 - self.floor))


class Backoff:
    """One loop's consecutive failures, and the pause each calls for under ``policy``.

    The coordinator's loops (the poll, launches, the reconcile report) each
    keep one: :meth:`failed` counts a failure and answers how long to wait,
    :meth:`succeeded` starts the count afresh.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.failures = 0

    def failed(self) -> float:
        self.failures += 1
        return self.policy.delay(self.failures)

    def succeeded(self) -> None:
        self.failures = 0


NO_RETRY = RetryPolicy(attempts=1)
DEFAULT_RETRY = RetryPolicy()
# /ready is idempotent on ready (a lost 204 looks like a request that never
# committed), so the runner keeps asking for up to 30 s (docs/design.md: Ready).
READY_RETRY = RetryPolicy(attempts=1000, base=0.5, cap=5.0, deadline=30.0)


class Response(Record):
    __slots__ = ("body", "headers", "reason", "status")
    status: int
    # Names lowercased (HTTP's are case-insensitive): look them up as "content-type".
    headers: Mapping[str, str]
    body: bytes
    reason: str  # the status line's reason phrase

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes, reason: str = "") -> None:
        self.status, self.headers, self.body, self.reason = status, headers, body, reason

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Claim(Frozen):
    """A poll's answer: the run this group claimed and the credentials for its runner."""

    __slots__ = ("assigned_expires_at", "run_id", "runner_id", "runner_token")
    run_id: str
    runner_id: str
    runner_token: str
    assigned_expires_at: str

    def __init__(self, run_id: str, runner_id: str, runner_token: str, assigned_expires_at: str) -> None:
        self._set(
            run_id=run_id, runner_id=runner_id, runner_token=runner_token, assigned_expires_at=assigned_expires_at
        )


class Upload(Frozen):
    """Where to PUT a sealed chunk (a presigned S3 URL, or Gantry's own signed upload URL)."""

    __slots__ = ("headers", "method", "url")
    url: str
    method: str
    headers: dict[str, str]

    def __init__(self, url: str, method: str = "PUT", headers: dict[str, str] | None = None) -> None:
        self._set(url=url, method=method, headers=dict(headers or {}))


def _error_from(status: int, body: bytes, reason: str = "") -> ApiError:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if isinstance(data, dict) and "code" in data:
        return ApiError(status, str(data["code"]), str(data.get("detail", "")), data)
    text = body[:300].decode("utf-8", errors="replace").strip()
    return ApiError(status, f"http_{status}", text or reason or "error", data)


def _jwt_part(token: str, index: int) -> dict[str, Any] | None:
    """The JSON object in part ``index`` (0 the header, 1 the claims) of a JWT, unverified; None if unreadable."""
    import base64  # here: not needed before a runner's ready (docs/runners.md, Start-up)

    try:
        part = token.split(".")[index]
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def group_token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a runner group token, read without its key (None when it could be one).

    Only the shape: three base64url parts, a header and claims that are JSON
    objects, audience ``runner-group`` and a group id. Whether Gantry signed it
    and still honours it, only Gantry can say.
    """
    token = token.strip()
    if token.count(".") != 2:
        return f"a JWT has three dot-separated parts, this has {token.count('.') + 1}"
    header, claims = _jwt_part(token, 0), _jwt_part(token, 1)
    if header is None or claims is None:
        return "its header or claims are not base64url-encoded JSON objects"
    if claims.get("aud") == "runner":
        return "it is a runner's token (audience runner), not a runner group's"
    if claims.get("aud") != "runner-group":
        return f"its audience is {claims.get('aud')!r}, not 'runner-group'"
    if not str(claims.get("sub", "")).isdigit():
        return "it names no group (claim sub)"
    return None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw else None
    except ValueError:
        return None


_PORTS = {"http": 80, "https": 443}
# Limits on what the server sends back, as http.client has them: a broken peer cannot make us read for ever.
_MAX_LINE = 65536
_MAX_HEADERS = 100
_BODYLESS = ("POST", "PUT", "PATCH")  # methods that announce an empty body (Content-Length: 0), as http.client does


class ProtocolError(Exception):
    """The peer's answer is not HTTP/1.x we can read (treated like a connection error: the server is unreachable)."""


def _clean(value: str, what: str) -> str:
    # Header injection: a CR or LF in a name or value (an upload's headers come from the server) would end the header.
    if "\r" in value or "\n" in value or "\0" in value:
        raise ValueError(f"invalid character in HTTP {what}: {value!r}")
    return value


def _request_bytes(method: str, host: str, target: str, payload: bytes | None, headers: Mapping[str, str]) -> bytes:
    """One HTTP/1.1 request, whole; a bad character raises ValueError here, before anything is connected or sent."""
    if any(c <= " " or c == "\x7f" for c in target):
        raise ValueError(f"invalid character in the request target {target!r}")
    lines = [f"{_clean(method, 'method')} {target} HTTP/1.1", f"Host: {_clean(host, 'host')}"]
    lines += [f"{_clean(name, 'header name')}: {_clean(value, 'header value')}" for name, value in headers.items()]
    if payload is not None or method in _BODYLESS:
        lines.append(f"Content-Length: {len(payload or b'')}")
    lines += ["Accept-Encoding: identity", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (payload or b"")


def _read_answer(sock: socket.socket, method: str) -> Response:
    """The answer on ``sock``: its body framed by Content-Length, chunked, or up to the close."""
    with sock.makefile("rb") as stream:
        while True:
            status, reason = _status_line(_line(stream))
            answer = _headers(stream)
            if not 100 <= status < 200:
                break  # an interim answer (100 Continue, 103 Early Hints) is followed by the real one
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in answer.get("transfer-encoding", "").lower():
            body = _chunked(stream)
        elif "content-length" in answer:
            length = answer["content-length"].strip()
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length!r}")
            body = stream.read(int(length))
            if len(body) != int(length):
                raise ProtocolError(f"answer cut short: {len(body)} of {length} bytes")
        else:
            body = stream.read()  # neither: the body ends where the server closes the connection
    return Response(status, answer, body, reason)


def _line(stream: Any) -> bytes:
    line: bytes = stream.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ProtocolError("answer line too long")
    if not line:
        raise ProtocolError("the connection closed before the answer was complete")
    return line


def _status_line(line: bytes) -> tuple[int, str]:
    version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {line[:100]!r}")
    return int(code), reason.strip()


def _headers(stream: Any) -> dict[str, str]:
    """The header block up to its blank line; names lowercased, a repeated name keeps its last value."""
    found: dict[str, str] = {}
    for _ in range(_MAX_HEADERS + 1):
        line = _line(stream).decode("latin-1")
        if line in ("\r\n", "\n"):
            return found
        name, colon, value = line.partition(":")
        if not colon:
            raise ProtocolError(f"bad header line {line[:100]!r}")
        found[name.strip().lower()] = value.strip()
    raise ProtocolError(f"more than {_MAX_HEADERS} headers")


def _chunked(stream: Any) -> bytes:
    """A chunked body: hex-sized chunks (extensions after ``;`` ignored) up to the zero chunk, then its trailers."""
    parts: list[bytes] = []
    while True:
        size_text = _line(stream).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            _headers(stream)  # trailers, if any: read and dropped
            return b"".join(parts)
        data = stream.read(size)
        if len(data) != size or _line(stream) not in (b"\r\n", b"\n"):
            raise ProtocolError("chunk cut short")
        parts.append(data)


class GantryClient:
    """Calls the API of the Gantry at ``server`` (the service root URL) with ``token``.

    ``scheme`` is ``Bearer`` for group and runner JWTs, ``Token`` for a user's
    API token. ``timeout`` bounds each request (a long poll adds its wait).
    """

    def __init__(
        self,
        server: str,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        scheme: str = "Bearer",
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urllib.parse.urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server must be an http(s):// URL, not {server!r}")
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.scheme = scheme
        self.retry = retry
        self._sleep = sleep
        self._lock = threading.Lock()
        self._inflight: set[socket.socket] = set()
        self._aborted = False
        # Unix time of the last answer below 400 (the coordinator's /healthz and metrics read it).
        self.last_success: float | None = None
        # Sent with every poll: the coordinator's identity headers (docs/protocol.md, "Coordinator identity").
        self.poll_headers: dict[str, str] = {}

    @property
    def token_subject(self) -> str:
        """The ``sub`` claim of this client's JWT (a group token's group id), read without verifying it:
        the server verifies; the client only needs to know which group it speaks for. Empty if unreadable."""
        claims = _jwt_part(self.token or "", 1)
        return str(claims.get("sub", "")) if claims is not None else ""

    # ------------------------------------------------------------ plumbing

    def url(self, path: str) -> str:
        """An API path (``/api/v1/...``) under the server root; an absolute URL is kept as it is."""
        if urllib.parse.urlsplit(path).scheme:
            return path
        if path.startswith("/api/"):
            return self.server + path
        # A path the server handed out (an upload URL): resolve it like a browser would.
        return urllib.parse.urljoin(self.server + "/", path)

    def abort(self) -> None:
        """Cut off abortable requests in flight (a parked long poll) and refuse new ones.

        Safe to call from a signal handler: it only flips a flag and shuts
        sockets down; the blocked call then fails with :class:`RequestAborted`.
        """
        self._aborted = True
        with self._lock:
            socks = list(self._inflight)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        auth: bool = True,
        abortable: bool = False,
    ) -> Response:
        """Send one request, retrying transient failures per ``retry``; raise :class:`ApiError` on a refusal."""
        policy = retry or self.retry
        url = self.url(path)
        if query:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(query)
        all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        payload = raw
        if body is not None:
            payload = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        if auth and self.token:
            all_headers["Authorization"] = f"{self.scheme} {self.token}"
        all_headers.update(headers or {})

        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self._send(method, url, payload, all_headers, timeout or self.timeout, abortable)
            except ApiError as exc:
                error: ApiError = exc
                wait = None
            else:
                if resp.status < 400:
                    self.last_success = time.time()
                    return resp
                error = _error_from(resp.status, resp.body, resp.reason)
                wait = _retry_after(resp.headers) if resp.status == 429 else None
            if isinstance(error, RequestAborted) or not error.transient or attempt >= policy.attempts:
                raise error
            pause = wait if wait is not None else policy.delay(attempt)
            if policy.deadline is not None:
                left = policy.deadline - (time.monotonic() - started)
                if left <= 0:
                    raise error
                pause = min(pause, left)
            self._sleep(pause)
            if self._aborted and abortable:
                raise RequestAborted()

    def _send(
        self, method: str, url: str, payload: bytes | None, headers: dict[str, str], timeout: float, abortable: bool
    ) -> Response:
        if abortable and self._aborted:
            raise RequestAborted()
        parts = urllib.parse.urlsplit(url)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        host = parts.netloc.rpartition("@")[2]  # never the URL's user:password
        request = _request_bytes(method, host, target, payload, headers)
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((parts.hostname or "", parts.port or _PORTS[parts.scheme]), timeout)
            if parts.scheme == "https":
                import ssl  # only here: a plain-http runner never pays for importing it

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
            if abortable:
                with self._lock:
                    self._inflight.add(sock)
                if self._aborted:  # abort() ran while we connected: it could not see this socket
                    raise RequestAborted()
            sock.sendall(request)
            return _read_answer(sock, method)
        except (OSError, ProtocolError) as exc:
            if abortable and self._aborted:
                raise RequestAborted() from exc
            raise ServerUnreachable(f"{method} {parts.path}: {type(exc).__name__}: {exc}") from exc
        finally:
            if sock is not None:
                if abortable:
                    with self._lock:
                        self._inflight.discard(sock)
                sock.close()

    # ------------------------------------------------------------ runner group (group JWT)

    def poll(self, wait: float = 0) -> Claim | None:
        """Claim a run, holding the request up to ``wait`` s until one arrives; None when there is none.

        Not retried here: the coordinator backs off between polls itself. A
        lost answer costs nothing but a lease (the run returns to pending).
        """
        resp = self.request(
            "GET",
            "/api/v1/runner-groups/poll",
            query={"wait": f"{wait:g}"},
            headers=self.poll_headers,
            retry=NO_RETRY,
            timeout=wait + self.timeout,
            abortable=True,
        )
        if resp.status == 204:
            return None
        data = resp.json()
        return Claim(
            run_id=str(data["run_id"]),
            runner_id=str(data["runner_id"]),
            runner_token=str(data["runner_token"]),
            assigned_expires_at=str(data["assigned_expires_at"]),
        )

    def group_demand(self) -> Response:
        """``GET /runner-groups/demand``: the cheapest call a group token may make, and side-effect free
        (the coordinator's start-up check). Not retried, and the raw answer: the caller judges its shape."""
        return self.request("GET", "/api/v1/runner-groups/demand", retry=NO_RETRY, abortable=True)

    def reconcile(self, workers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Report the group's workers (docs/protocol.md, "Reconcile"); answers (stop orders, exits to report again).

        Not retried here: the coordinator reports again on its next turn, and
        a report is idempotent.
        """
        data = self.request("POST", "/api/v1/runner-groups/reconcile", body={"workers": workers}, retry=NO_RETRY).json()
        if not isinstance(data, dict):
            raise ApiError(200, "bad_answer", "reconcile answered something other than a JSON object", data)
        return list(data.get("stop") or []), list(data.get("retry") or [])

    def dispatch_failed(self, *, run_id: str, runner_id: str, error: str) -> None:
        self.request(
            "POST",
            "/api/v1/runner-groups/dispatch-failed",
            body={"run_id": run_id, "runner_id": runner_id, "error": error[:4000]},
        )

    # ------------------------------------------------------------ runner (runner JWT)

    def ready(self, runner_id: str, retry: RetryPolicy = READY_RETRY, **metadata: Any) -> None:
        self.request("POST", f"/api/v1/runners/{runner_id}/ready", body=metadata, retry=retry)

    def accept(self, run_id: str) -> dict[str, Any]:
        """The RunContext. A retry after a lost answer is answered 409 ``accept_response_undeliverable``."""
        data = self.request("POST", f"/api/v1/runs/{run_id}/accept").json()
        assert isinstance(data, dict)
        return data

    def status(self, run_id: str, retry: RetryPolicy | None = None) -> dict[str, Any]:
        data = self.request("GET", f"/api/v1/runs/{run_id}/status", retry=retry).json()
        assert isinstance(data, dict)
        return data

    def acknowledge_cancel(self, run_id: str) -> None:
        self.request("POST", f"/api/v1/runs/{run_id}/acknowledging-cancel")

    def live_push(
        self, run_id: str, *, chunk_index: int, sealed_chunks: int, data: str, times: list[list[int]] | None = None
    ) -> None:
        """Best effort: one try; the next tick pushes a fresher snapshot anyway. ``times``: the chunk's time marks."""
        body: dict[str, Any] = {"chunk_index": chunk_index, "sealed_chunks": sealed_chunks, "data": data}
        if times:
            body["times"] = times
        self.request("POST", f"/api/v1/runs/{run_id}/logs/live", body=body, retry=NO_RETRY)

    def chunk_upload(
        self, run_id: str, index: int, *, sha256: str, size: int, times: list[list[int]] | None = None
    ) -> Upload:
        body: dict[str, Any] = {"sha256": sha256, "size": size}
        if times:
            body["times"] = times  # kept beside the chunk; the chunk's bytes stay the log's own
        data = self.request("POST", f"/api/v1/runs/{run_id}/logs/chunks/{index}", body=body).json()
        return Upload(
            url=str(data["url"]),
            method=str(data.get("method") or "PUT"),
            headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
        )

    def put_chunk(self, upload: Upload, data: bytes, retry: RetryPolicy | None = None) -> None:
        """PUT the gzip bytes where ``upload`` says; never with our token (S3 would refuse a second auth)."""
        self.request(upload.method, upload.url, raw=data, headers=upload.headers, auth=False, retry=retry)

    def done(
        self,
        run_id: str,
        *,
        outcome: str,
        exit_code: int | None,
        sealed_chunks: int,
        manifest: dict[str, Any],
        error: str = "",
        retry: RetryPolicy | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "outcome": outcome,
            "exit_code": exit_code,
            "sealed_chunks": sealed_chunks,
            "manifest": manifest,
        }
        if error:
            body["error"] = error[:4000]
        self.request("POST", f"/api/v1/runs/{run_id}/done", body=body, retry=retry)

    def deregister(self, runner_id: str, retry: RetryPolicy | None = None) -> None:
        self.request("DELETE", f"/api/v1/runners/{runner_id}/deregister", retry=retry)

    def oidc_exchange(self, runner_id: str, oidc_token: str, correlation: str = "") -> str:
        """A GitHub Actions OIDC token → this runner's runner token (github_actions groups; works once).

        Sent without any Gantry credential: the OIDC token is the credential.
        Transient failures are retried; a refusal (401/403/404) is final.
        """
        body = {"token": oidc_token, **({"correlation": correlation} if correlation else {})}
        data = self.request("POST", f"/api/v1/runners/{runner_id}/oidc-exchange", body=body, auth=False).json()
        return str(data["runner_token"])

    # ------------------------------------------------------------ users (API token; scheme="Token")

    def create_deployment(self, stack_id: int, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        data = self.request(
            "POST", f"/api/v1/stacks/{stack_id}/deployments", body={"spec": spec} if spec else {}, retry=NO_RETRY
        ).json()
        assert isinstance(data, dict)
        return data

    def get_run(self, run_id: str) -> dict[str, Any]:
        data = self.request("GET", f"/api/v1/runs/{run_id}").json()
        assert isinstance(data, dict)
        return data

    def cancel_run(self, run_id: str) -> dict[str, Any] | None:
        data = self.request("POST", f"/api/v1/runs/{run_id}/cancel").json()
        return data if isinstance(data, dict) else None

    def run_logs(self, run_id: str, offset: int = 0) -> dict[str, Any]:
        """``{text, next_offset, complete, final}`` from ``offset`` on (docs/logs.md)."""
        data = self.request("GET", f"/api/v1/runs/{run_id}/logs", query={"offset": offset}).json()
        assert isinstance(data, dict)
        return data


def fetch_actions_oidc_token(request_url: str, request_token: str, audience: str, timeout: float = 30.0) -> str:
    """Ask GitHub Actions for an OIDC token for ``audience`` (the job needs ``permissions: id-token: write``).

    ``request_url`` and ``request_token`` are the job's ``ACTIONS_ID_TOKEN_REQUEST_URL`` and
    ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``; GitHub answers ``{"value": "<jwt>"}``.
    """
    sep = "&" if "?" in request_url else "?"
    url = f"{request_url}{sep}{urllib.parse.urlencode({'audience': audience})}"
    client = GantryClient(url, request_token, timeout=timeout, scheme="bearer")
    data = client.request("GET", url).json()
    if not isinstance(data, dict) or not data.get("value"):
        raise ApiError(0, "oidc_unavailable", "GitHub Actions answered no OIDC token")
    return str(data["value"])
