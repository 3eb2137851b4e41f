"""Whether a port can be bound, asked before a server loads a model for a minute and then dies
on "address already in use" with a traceback."""

from __future__ import annotations

import socket


def port_problem(host: str, port: int) -> str | None:
    """None when `host:port` can be bound now (port 0: any free port), else one line naming the
    port and what to do."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            return (f"port {port} on {host} is not free ({e.strerror or e}): pick another with "
                    "--port, or stop the program that holds it")
    return None
