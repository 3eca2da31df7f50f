"""Who may reach ``localspec serve``: the address it binds, its API key and the web pages allowed to call it.

Checked before anything is loaded, and without the server extra installed,
so a bad flag costs no model load. A server on a loopback address answers
only the loopback names in the Host header (a page that rebinds its own name
to 127.0.0.1 sends its own); any other address needs an API key, since
anyone who can reach the machine could use the models.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from ..errors import ConfigError

#: Host names a loopback server answers to.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_ORIGIN = re.compile(r"https?://[a-z0-9.\-\[\]:]+")


@dataclass(frozen=True)
class Access:
    """The checked access rules.

    Attributes:
        host: the address to bind.
        api_key: the key every request but ``/health`` must carry, or None.
        origins: the web page origins allowed to call the API (``"*"``: any).
        hosts: the Host header names accepted (empty: any, for a server bound beyond loopback).
    """

    host: str
    api_key: Optional[str]
    origins: tuple[str, ...]
    hosts: tuple[str, ...]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is reachable from this machine only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_access(host: str, api_key: Optional[str] = None, origins: Iterable[str] = ()) -> Access:
    """The access rules for serving on ``host``, checked.

    Raises:
        ConfigError: a bind beyond loopback without an API key, an API key no HTTP client could send, or
            an origin written otherwise than browsers send it.
    """
    loopback = is_loopback(host)
    if not loopback and not api_key:
        raise ConfigError(f"Binding {host} would let anyone who can reach this machine use the models; "
                          "give --api-key KEY, or bind 127.0.0.1.")
    if api_key and not (api_key.isascii() and api_key.isprintable() and api_key == api_key.strip()):
        raise ConfigError("The API key must be printable ASCII without spaces at either end: HTTP "
                          "headers cannot carry anything else, so no client could send it.")
    origins = tuple(origins)
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ConfigError(f"--allow-origin {origin!r} is not an origin as browsers send it: scheme "
                              "and host in lower case, an optional port, no path or trailing slash "
                              "(e.g. http://localhost:3000), or '*'.")
    hosts = (*LOOPBACK_NAMES, f"[{host}]" if ":" in host else host) if loopback else ()
    return Access(host, api_key, origins, hosts)
