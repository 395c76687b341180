"""What the project's servers (the recording proxy, the OTLP receiver) share about addresses."""

from __future__ import annotations

import re

from scepsy_common.errors import InputError

_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<host>[^:\s\[\]]+)):(?P<port>[0-9]{1,5})")


def parse_listen(text: str, source: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0: any free port) as ``(host, port)``."""
    m = _LISTEN.fullmatch(text)
    if m is None or int(m["port"]) > 65535:
        raise InputError(source, "", "HOST:PORT with a port in 0..65535, e.g. 127.0.0.1:4318 "
                         "or [::1]:4318", text)
    return m["v6"] or m["host"], int(m["port"])
