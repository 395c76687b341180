"""Addresses, one rule each: where a server of ours listens (:func:`parse_listen`) and the
URL of a server we call (:func:`check_url`: the recording proxy's upstreams, a routing table's
endpoints); how long our clients keep an idle connection (:data:`CLIENT_KEEPALIVE_S`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from scepsy_common.errors import InputError

CLIENT_KEEPALIVE_S = 4.0
"""How long our HTTP clients reuse an idle pooled connection to a server, s: below the 5 s
after which uvicorn (vLLM's HTTP server, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) closes one, so that
a request is not sent on a connection its server is closing at that moment."""

_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<host>[^:\s\[\]]+)):(?P<port>[0-9]{1,5})")


def parse_listen(text: str, source: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0: any free port) as ``(host, port)``."""
    m = _LISTEN.fullmatch(text)
    if m is None or int(m["port"]) > 65535:
        raise InputError(source, "", "HOST:PORT with a port in 0..65535, e.g. 127.0.0.1:4318 "
                         "or [::1]:4318", text)
    return m["v6"] or m["host"], int(m["port"])


PORT_MIN, PORT_MAX = 1, 65535
URL_EXPECTED = (f"an http:// or https:// URL with a host and, if given, a port in "
                f"{PORT_MIN}..{PORT_MAX} (e.g. http://127.0.0.1:8000/v1; no spaces, quotes, "
                "query or fragment)")
_URL_BAD = re.compile(r"[\s'\"`$\\\x00-\x1f\x7f-\x9f]")


def check_url(url: object, source: str, field: str = "") -> str:
    """``url`` if it is the URL of an http(s) server: a host, a port (given or the scheme's)
    in ``1..65535``, no query or fragment and none of the characters a shell or a log line
    would read otherwise; else an :class:`InputError` naming ``source`` and ``field`` and
    saying :data:`URL_EXPECTED`."""
    if not isinstance(url, str) or _URL_BAD.search(url):
        raise InputError(source, field, URL_EXPECTED, url)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number, or beyond 65535
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or (port is not None and not PORT_MIN <= port <= PORT_MAX):
        raise InputError(source, field, URL_EXPECTED, url)
    return url
