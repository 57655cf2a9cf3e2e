"""A TCP proxy a test can cut, to put one worker behind a network partition.

``cut()`` stops relaying bytes in both directions and leaves every socket open: like a
partition, nothing arrives and nothing is refused; the kernel buffers what was sent, and
connections made meanwhile hang before they reach the server. ``heal()`` relays again,
so what was sent during the partition arrives late, as after a real one.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class TcpProxy:
    """``127.0.0.1:<port>`` relays to ``target``; start with :meth:`start`."""

    target: tuple[str, int]
    port: int = 0
    flowing: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _sockets: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()
        return self

    def cut(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self.closed.set()
        self.flowing.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        if self._listener is not None:
            sockets.append(self._listener)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def url_for(self, url: str) -> str:
        """``url`` with its ``host:port`` replaced by this proxy's."""
        host, port = self.target
        return url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self.closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.flowing.wait()  # a connection made during a partition hangs until it heals
        if self.closed.is_set():
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets += [client, upstream]
        peers = {client: upstream, upstream: client}
        try:
            while not self.closed.is_set():
                if not self.flowing.wait(0.2):
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.2)
                for sock in readable:
                    if not self.flowing.is_set():
                        break  # cut after select: leave the bytes in the kernel
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()
