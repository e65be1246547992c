"""guestfwd relay: QEMU runs ``python3 relay.py PORT`` for every guest connection to a forwarded
address (``-netdev user,guestfwd=tcp:ADDR:PORT-cmd:...``), with that connection as stdin and
stdout; this joins it to 127.0.0.1:PORT on the host. A stand-in that is down (nothing listening)
closes the guest's connection at once, as an unreachable endpoint would. Standard library only,
nothing on stderr (it is the guest's socket too)."""

from __future__ import annotations

import os
import select
import socket
import sys


def main() -> int:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # stderr is the guest's socket: never write to it
    try:
        backend = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    except OSError:
        return 1
    backend.settimeout(None)
    guest = socket.socket(fileno=os.dup(0))
    guest_open = True
    while True:
        readable, _, _ = select.select([guest, backend] if guest_open else [backend], [], [])
        if guest in readable:
            data = guest.recv(1 << 16)
            if data:
                backend.sendall(data)
            else:
                guest_open = False
                backend.shutdown(socket.SHUT_WR)
        if backend in readable:
            data = backend.recv(1 << 16)
            if not data:
                return 0  # the guest sees EOF when this process exits
            guest.sendall(data)


if __name__ == "__main__":
    sys.exit(main())
