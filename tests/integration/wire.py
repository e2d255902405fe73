"""A TCP relay to the real Redis that can lose replies: the fault of a connection that breaks
after a command ran and before its answer arrived (a failover, a network cut)."""

from __future__ import annotations

import contextlib
import socket
import threading


class LossyRelay:
    """Relays 127.0.0.1:``port`` to ``target``; while :attr:`lose_replies` is set, a reply from
    the server is dropped and its connection closed (the command ran all the same)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lose_replies = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies and self.lose_replies:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):  # shut down first: the other direction's thread holds it
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self._server.close()
