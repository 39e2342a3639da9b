"""Put a stand-in at an address inside a fake instance's network namespace: a listening socket created in that
namespace (setns on a short-lived thread), forwarding each connection to a server on this machine's loopback.

The fake instance runs with `--network none`: its namespace, made for it, holds only loopback and the addresses
added here; nothing else on any network is a target.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def listen_in(pid: int, address: str, port: int) -> socket.socket:
    """A listening TCP socket bound to address:port inside the network namespace of process pid."""
    made: dict[str, object] = {}

    def inside() -> None:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the network namespace of {pid}: {os.strerror(err)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
            made["sock"] = sock
        except BaseException as e:  # handed to the caller's thread
            made["error"] = e
        finally:
            os.close(fd)

    thread = threading.Thread(target=inside)  # the namespace switch dies with this thread
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]  # type: ignore[misc]
    return made["sock"]  # type: ignore[return-value]


class Forward:
    """Accept on `listener` (in a fake instance) and splice each connection to 127.0.0.1:upstream_port."""

    def __init__(self, listener: socket.socket, upstream_port: int) -> None:
        self.listener = listener
        self.upstream = ("127.0.0.1", upstream_port)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


PIPE_BYTES = 1 << 20  # one splice moves at most what the pipe holds


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until src ends, then end dst's writing side. splice(2) through a pipe moves the bytes inside
    the kernel: a real-size boot sends 16.8 GB through here, and a copy through Python would cost this machine's
    two cores what the instance's fetcher needs (the rehearsal's path would then measure the harness, not the
    fetcher)."""
    try:
        _splice(src, dst)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _splice(src: socket.socket, dst: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe only means more calls
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        while n := os.splice(src.fileno(), write_end, PIPE_BYTES):
            while n:
                n -= os.splice(read_end, dst.fileno(), n)
    finally:
        os.close(read_end)
        os.close(write_end)
