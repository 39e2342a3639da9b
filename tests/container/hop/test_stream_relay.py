"""The hop's streaming relay (relay.py): an SSE answer chunked both ways goes from llama-server's socket to the
client's in the read callback. Whatever way llama-server's bytes fall into reads, the client gets the same answer
and the connection goes back to the pool only after a clean end; a client that falls behind pauses reading
llama-server instead of buffering in the hop, and one that stops reading for the send timeout is let go."""

from __future__ import annotations

import json
import socket
import time

import pytest

from gguf_serve.container.hop import names
from gguf_serve.container.hop.proxy import Limits, ProxyServer

from .conftest import KEY
from .scripted import ANSWER, BIG_EVENTS


@pytest.fixture
def relay_hop(make_pooled_hop) -> ProxyServer:
    return make_pooled_hop(limits=Limits(send_timeout_s=1.0))


def _ask(hop: ProxyServer, *, rcvbuf: int | None = None) -> socket.socket:
    client = socket.socket()
    if rcvbuf:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    client.settimeout(10)
    client.connect(("127.0.0.1", hop.server_address[1]))
    body = json.dumps({"stream": True, "messages": []}).encode()
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %b\r\n"
                   b"Content-Length: %d\r\n\r\n%b" % (KEY.encode(), len(body), body))  # fmt: skip
    return client


def _read_answer(client: socket.socket) -> tuple[bytes, bool]:
    """(the answer's payload, whether its chunked body ended) as the client's bytes say."""
    seen = bytearray()
    while not seen.endswith(b"\r\n0\r\n\r\n"):
        data = client.recv(1 << 20)
        if not data:
            break
        seen += data
    at = seen.index(b"\r\n\r\n") + 4
    payload = bytearray()
    while at < len(seen) and (size := int(seen[at : seen.index(b"\r\n", at)], 16)):
        start = seen.index(b"\r\n", at) + 2
        payload += seen[start : start + size]
        at = start + size + 2
    return bytes(payload), seen[at:] == b"0\r\n\r\n"


def _wait(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def _requests(hop: ProxyServer, code: str) -> float:
    text = hop.metrics.exposition()
    line = f'{names.REQUESTS}{{code="{code}",stream="true"}} '
    return next((float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line)), 0.0)


@pytest.mark.parametrize("step", ["together", "split", "sse", "paced"])
def test_the_answer_arrives_whole_however_it_is_read_and_the_connection_is_kept(scripted, relay_hop, step) -> None:
    """Timed the same however it is read: "paced" is one whole event per read (the relay's short path), the others
    mix pieces and several events in one read."""
    scripted.script = [step, "sse"]
    for _ in range(2):
        with _ask(relay_hop) as client:
            payload, ended = _read_answer(client)
        assert payload == b"".join(ANSWER) and ended
        _wait(lambda: len(relay_hop.upstream) == 1)
    assert scripted.accepts == 1
    _wait(lambda: _requests(relay_hop, "200") == 2)  # timed as a whole answer: the first token, the gaps
    histograms = relay_hop.metrics.histograms
    assert histograms[names.TTFT].snapshot()[2] == 2
    assert histograms[names.ITL].snapshot()[2] == 2  # two tokens ("a", "b") in each answer: one gap each
    assert histograms[names.QUEUE_WAIT].snapshot()[2] == 2  # the timings event was read in both
    assert histograms[names.DECODE_TPS].snapshot()[1] == 2 * 20.0


def test_a_stream_gives_the_client_connection_its_flow_control_back(scripted, relay_hop) -> None:
    """During a stream each token is written from the read callback (no high-water mark on the client's transport);
    after it, the kept client connection has the marks every connection has."""
    scripted.script = ["paced"]
    with _ask(relay_hop) as client, socket.create_connection(("127.0.0.1", relay_hop.server_address[1])):
        assert _read_answer(client)[1]
        _wait(lambda: len(relay_hop._connections) == 2)
        marks = lambda: {conn.transport.get_write_buffer_limits() for conn in relay_hop._connections}  # noqa: E731
        _wait(lambda: len(marks()) == 1)  # the answer's task gives them back just after its last write
        assert next(iter(marks()))[1] > 0  # both connections still open: both in the table


def test_every_connection_of_the_hop_sends_without_delay(scripted, relay_hop) -> None:
    """TCP_NODELAY on the client's and on llama-server's connection, whichever the loop (asyncio leaves it off an
    accepted socket): without it a token's small write may wait for the last one's ACK."""
    scripted.script = ["paced"]
    with _ask(relay_hop) as client:
        assert _read_answer(client)[1]
        _wait(lambda: len(relay_hop.upstream) == 1)
        transports = [conn.transport for conn in relay_hop._connections]
        transports += [conn.transport for conn in relay_hop.upstream._idle]
        assert len(transports) == 2
        for transport in transports:
            assert transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_bytes_after_the_answer_cut_it_and_close_the_connection(scripted, relay_hop) -> None:
    scripted.script = ["trailing", "sse"]
    with _ask(relay_hop) as client:
        _, ended = _read_answer(client)
    assert not ended  # no last chunk: the client sees a cut answer, not one with something smuggled after it
    _wait(lambda: _requests(relay_hop, "upstream_closed") == 1)
    assert len(relay_hop.upstream) == 0
    with _ask(relay_hop) as client:
        assert _read_answer(client)[1]
    assert scripted.accepts == 2


def test_a_client_that_falls_behind_pauses_llama_server_and_then_gets_every_byte(scripted, relay_hop) -> None:
    """Without the pause the hop would read all 32 MiB into memory while the client reads nothing."""
    scripted.script = ["big", "sse"]
    client = _ask(relay_hop, rcvbuf=65536)
    _wait(lambda: scripted.sent > 0)
    time.sleep(0.5)  # less than the send timeout: the client is slow, not gone
    stalled = scripted.sent
    time.sleep(0.3)
    assert scripted.sent == stalled < BIG_EVENTS * 16384  # llama-server's writes wait for the client
    payload, ended = _read_answer(client)
    client.close()
    assert ended and payload.count(b'"content":"x') == BIG_EVENTS and payload.endswith(ANSWER[-1])
    _wait(lambda: len(relay_hop.upstream) == 1)  # a clean end: kept
    with _ask(relay_hop) as again:
        assert _read_answer(again)[1]
    assert scripted.accepts == 1


def test_a_client_that_stops_reading_is_let_go_after_the_send_timeout(scripted, relay_hop) -> None:
    scripted.script = ["big", "sse"]
    client = _ask(relay_hop, rcvbuf=65536)
    assert scripted.closed_by_hop.wait(5)  # 1 s send timeout: the hop closed llama-server's connection
    _wait(lambda: _requests(relay_hop, "client_closed") == 1)
    client.close()
    assert len(relay_hop.upstream) == 0
    with _ask(relay_hop) as again:
        assert _read_answer(again)[1]
    assert scripted.accepts == 2


def test_a_client_that_leaves_while_behind_closes_llama_servers_connection_at_once(scripted, make_pooled_hop) -> None:
    hop = make_pooled_hop(limits=Limits(send_timeout_s=30.0))
    scripted.script = ["big"]
    client = _ask(hop, rcvbuf=65536)
    _wait(lambda: scripted.sent > 0)
    time.sleep(0.3)  # the relay is paused for this client
    client.close()  # unread bytes: a reset
    assert scripted.closed_by_hop.wait(3)  # not at the 30 s send timeout: the reset ends the wait
    _wait(lambda: _requests(hop, "client_closed") == 1)
    assert len(hop.upstream) == 0
