"""Requests too malformed for aiohttp to parse: a 400 in the contract's error format and one log
line, never a traceback."""

import asyncio
import json
import socket

from tests.support.helpers import ReceiverProcess, free_port, write_config

JUNK = (
    b"GARBAGE \x00\x01\r\n\r\n",
    b"POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /webhooks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
    b"POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: a\r\nContent-Type: b\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Junk: a\x01b\r\nContent-Length: 0\r\n\r\n",
    b"POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * 9000 + b"\r\n\r\n",
)


def exchange(port: int, data: bytes) -> bytes:
    """The whole answer: the receiver closes the connection after it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


async def test_unparseable_requests_are_one_line_each(tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "admin": {"port": free_port()},
            "webhook": {"secrets": ["whsec_malformed"]},
            "store": {"url": "sqlite:///inbox.db"},
            "log": {"format": "json"},
        },
    )
    proc = ReceiverProcess(config, role="intake")
    proc.start()
    try:
        await proc.wait_ready()
        for junk in JUNK:
            answer = await asyncio.to_thread(exchange, proc.public_port, junk)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.") and b" 400 " in head.split(b"\r\n")[0], answer
            assert b"content-type: application/json" in head.lower(), answer
            error = json.loads(body)["error"]
            assert error["code"] == "malformed_payload" and error["message"], body
        await asyncio.sleep(0.3)
        assert proc.terminate() == 0
    finally:
        proc.stop()
    log = proc.log()
    assert "Traceback" not in log
    for line in log.splitlines():
        json.loads(line)  # every line of stderr is one JSON log line
    assert "Error handling request" in log
