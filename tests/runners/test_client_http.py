"""The API client's own HTTP/1.1 transport, byte for byte, against a raw socket server of the test's own.

The client speaks HTTP on a socket itself (runners/client.py, ``_request_bytes``, ``_read_answer``:
``http.client`` cost a quarter of a runner's start-up), so these tests pin
what it must get right: the request it writes, and every way an answer's body
can be framed (Content-Length, chunked with extensions and trailers, up to the
close), interim 1xx answers, an answer cut short, header injection, and TLS.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runners.client import NO_RETRY, ApiError, GantryClient, ServerUnreachable


class RawServer:
    """Accepts connections, records each request's bytes, and answers with the next scripted raw bytes."""

    def __init__(self, answers: list[bytes], tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.tls = tls
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self._answer_all()
        except OSError:
            return  # the test is over and closed the listener

    def _answer_all(self) -> None:
        for answer in self.answers:
            conn, _ = self.listener.accept()
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()  # the client refused our certificate: this answer waits for the next connection
                    conn, _ = self.listener.accept()
                    conn = self.tls.wrap_socket(conn, server_side=True)
            with conn:
                self.requests.append(self._read_request(conn))
                conn.sendall(answer)

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                return data  # the client closed without a whole request
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(answers: list[bytes], tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(answers, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.listener.close()


def client(server: RawServer, scheme: str = "http") -> GantryClient:
    return GantryClient(f"{scheme}://localhost:{server.port}", "tok", timeout=10, retry=NO_RETRY)


def test_the_request_is_http_1_1_with_host_length_close_and_the_json_body(raw: Callable[..., RawServer]) -> None:
    server = raw([b"HTTP/1.1 204 No Content\r\n\r\n"])
    client(server).ready("r1", launcher="local", pid=7)
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /api/v1/runners/r1/ready HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Host"] == f"localhost:{server.port}"
    assert headers["Authorization"] == "Bearer tok"
    assert headers["Connection"] == "close"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body) == {"launcher": "local", "pid": 7}


def test_a_content_length_body_and_lowercased_headers(raw: Callable[..., RawServer]) -> None:
    body = json.dumps({"status": "running"}).encode()
    server = raw([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Odd: a:b\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body)])  # fmt: skip
    resp = client(server).request("GET", "/api/v1/runs/1/status")
    assert (resp.status, resp.reason, resp.json()) == (200, "OK", {"status": "running"})
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-odd"] == "a:b"


def test_a_chunked_body_with_extensions_and_trailers_is_joined(raw: Callable[..., RawServer]) -> None:
    server = raw([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"5;ext=1\r\n{\"a\":\r\n4\r\n 12}\r\n0\r\nX-Trailer: t\r\n\r\n"])  # fmt: skip
    assert client(server).request("GET", "/api/v1/x").json() == {"a": 12}


def test_a_body_without_length_ends_at_the_close_and_1xx_answers_are_skipped(raw: Callable[..., RawServer]) -> None:
    server = raw([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\n[1, 2]"])
    assert client(server).request("GET", "/api/v1/x").json() == [1, 2]


def test_an_error_answer_carries_its_reason_phrase_when_it_has_no_body(raw: Callable[..., RawServer]) -> None:
    server = raw([b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n"])
    with pytest.raises(ApiError) as caught:
        client(server).request("GET", "/api/v1/x")
    assert str(caught.value) == "418 http_418: I'm a teapot"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # cut short
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a chunk size that is no number
        b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP at all
        b"",  # closed without a word
    ],
)
def test_a_broken_answer_is_an_unreachable_server_not_a_traceback(raw: Callable[..., RawServer], answer: bytes) -> None:
    server = raw([answer])
    with pytest.raises(ServerUnreachable):
        client(server).request("GET", "/api/v1/x")


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(raw: Callable[..., RawServer]) -> None:
    server = raw([b"HTTP/1.1 204 No Content\r\n\r\n"])
    with pytest.raises(ValueError, match="invalid character"):
        client(server).request("PUT", "/upload", raw=b"x", headers={"X-Amz-Meta": "a\r\nInjected: yes"})
    client(server).request("GET", "/api/v1/x")  # the one scripted answer is still there for a sound request
    assert b"Injected" not in server.requests[0]


def test_https_verifies_the_server_certificate(
    raw: Callable[..., RawServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    body = b'{"ok": true}'
    server = raw([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)] * 2, tls=tls)
    # Not trusted yet: the default context refuses the unknown certificate (the handshake fails on our side).
    with pytest.raises(ServerUnreachable, match=r"CERTIFICATE_VERIFY_FAILED|SSLError"):
        client(server, "https").request("GET", "/api/v1/x")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # OpenSSL's default verify paths read it
    assert client(server, "https").request("GET", "/api/v1/x").json() == {"ok": True}
