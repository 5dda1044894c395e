"""``HOST:PORT`` as the servers' ``--listen`` flags take it."""

from __future__ import annotations


def split_host_port(value: str, default_host: str = "127.0.0.1") -> tuple[str, int] | None:
    """``HOST:PORT`` (or a bare ``PORT`` on ``default_host``; IPv6 hosts in
    brackets), or None when the port is not a number from 0 to 65535 (each
    caller names its own field in the error)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = default_host, value
    try:
        number = int(port)
    except ValueError:
        return None
    if not 0 <= number <= 65535:
        return None
    return host.strip("[]") or default_host, number
