"""Proxies and loopback: a loopback destination never goes through a proxy, ``NO_PROXY`` is matched as curl and
requests match it (a table, cross-checked against the real ``curl`` where curl's own rules have not changed
between versions), and ``localhost`` names are reached without asking any resolver.

The real-process cases run the detached flusher (``python -m spool_reporter._detached``) with every proxy variable
pointing at a recording forward proxy on loopback, against a collector on 127.0.0.1 or ``[::1]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spool_reporter import _http
from spool_reporter._hook import django_app

from ._helpers import Figures, flusher_cmd, ids_in, silent_dns, spool_bytes
from support.polling import wait_for
from support.servers import Proxy, Server, fill, ipv6_loopback_socket, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: namespaces")]

APP = django_app("5.2")
PROXY = "http://192.0.2.1:3128"  # TEST-NET-1: never reachable, and never contacted (see _curl_tries)
NAME_ADDRESS = "198.51.100.7"  # TEST-NET-2: where curl is told a name "resolves" (no DNS is asked)

# (no_proxy, url, bypass, curl): whether NO_PROXY exempts url from the proxy, and whether curl (7.88 and 8.x,
# whose rules for these forms have not changed) decides the same -- False where this project decides
# differently on purpose (loopback, ports, "*.name") or where curl versions disagree with each other (IPv6).
NO_PROXY_TABLE: list[Any] = [
    pytest.param("*", "https://collector.example/", True, True, id="star"),
    pytest.param("", "https://collector.example/", False, True, id="empty"),
    pytest.param("collector.example", "https://collector.example/", True, True, id="name"),
    pytest.param("collector.example", "https://www.collector.example/", True, True, id="name-suffix"),
    pytest.param(".collector.example", "https://collector.example/", True, True, id="dot-matches-domain"),
    pytest.param(".collector.example", "https://a.b.collector.example/", True, True, id="dot-suffix"),
    pytest.param("*.collector.example", "https://a.collector.example/", True, False, id="star-dot"),
    pytest.param("collector.example", "https://notcollector.example/", False, True, id="not-a-label"),
    pytest.param("ample.example", "https://example.example/", False, True, id="not-a-label-2"),
    pytest.param("www.collector.example", "https://collector.example/", False, True, id="longer-entry"),
    pytest.param("COLLECTOR.Example", "https://collector.EXAMPLE/", True, True, id="case"),
    pytest.param("collector.example.", "https://collector.example/", True, True, id="entry-trailing-dot"),
    pytest.param("collector.example", "https://collector.example./", True, True, id="host-trailing-dot"),
    pytest.param("other.example, collector.example", "https://collector.example/", True, True, id="comma-blank"),
    pytest.param("other.example collector.example", "https://collector.example/", True, True, id="blank"),
    pytest.param("other.example,,collector.example", "https://collector.example/", True, True, id="commas"),
    pytest.param("other.example,*", "https://collector.example/", False, True, id="star-in-a-list"),
    pytest.param("10.1.2.3", "https://10.1.2.3/", True, True, id="ipv4"),
    pytest.param("10.1.2.3", "https://10.1.2.30/", False, True, id="ipv4-no-prefix"),
    pytest.param("10.0.0.0/8", "https://10.1.2.3/", True, True, id="ipv4-cidr"),
    pytest.param("10.0.0.0/24", "https://10.1.2.3/", False, True, id="ipv4-cidr-outside"),
    pytest.param("10.1.2.3/32", "https://10.1.2.3/", True, True, id="ipv4-cidr-32"),
    pytest.param("1.2.3", "https://10.1.2.3/", False, True, id="ipv4-fragment"),
    pytest.param("10.1.2.3", "https://collector.example/", False, True, id="ip-entry-name-host"),
    pytest.param("collector.example", "https://10.1.2.3/", False, True, id="name-entry-ip-host"),
    pytest.param("fd00::1", "https://[fd00::1]/", True, False, id="ipv6"),
    pytest.param("[fd00::1]", "https://[fd00::1]/", True, False, id="ipv6-brackets"),
    pytest.param("fd00::/8", "https://[fd00::1]/", True, False, id="ipv6-cidr"),
    pytest.param("[fd00::]/8", "https://[fd00::1]/", True, False, id="ipv6-cidr-brackets"),
    pytest.param("fd00::/16", "https://[fe80::1]/", False, False, id="ipv6-cidr-outside"),
    pytest.param("10.0.0.0/8", "https://[::ffff:10.1.2.3]/", False, False, id="families-differ"),
    pytest.param("collector.example:8443", "https://collector.example:8443/", True, False, id="port"),
    pytest.param("collector.example:8443", "https://collector.example/", False, False, id="other-port"),
    pytest.param("collector.example:443", "https://collector.example/", True, False, id="default-port"),
    pytest.param("collector.example", "https://collector.example:8443/", True, True, id="any-port"),
    pytest.param("[fd00::1]:8443", "https://[fd00::1]:8443/", True, False, id="ipv6-port"),
    pytest.param("10.1.2.3:8443", "https://10.1.2.3/", False, False, id="ipv4-other-port"),
    # Loopback never goes through a proxy, whatever NO_PROXY says (curl would use the proxy).
    pytest.param("", "http://127.0.0.1:8000/v1/batch", True, False, id="loopback-ipv4"),
    pytest.param("", "http://127.9.9.9:8000/v1/batch", True, False, id="loopback-127/8"),
    pytest.param("", "http://localhost:8000/v1/batch", True, False, id="loopback-localhost"),
    pytest.param("", "http://LOCALHOST.:8000/v1/batch", True, False, id="loopback-localhost-dot"),
    pytest.param("", "http://collector.localhost:8000/", True, False, id="loopback-dot-localhost"),
    pytest.param("", "http://[::1]:8000/v1/batch", True, False, id="loopback-ipv6"),
    pytest.param("", "https://[::ffff:127.0.0.1]/", True, False, id="loopback-ipv4-mapped"),
    pytest.param("other.example", "https://localhost/", True, False, id="loopback-despite-no-proxy"),
    pytest.param("", "https://localhost.example/", False, True, id="not-loopback-localhost-prefix"),
    pytest.param("", "https://127.0.0.1.example/", False, True, id="not-loopback-ip-prefix"),
]


@pytest.mark.parametrize(("no_proxy", "url", "bypass", "curl"), NO_PROXY_TABLE)
def test_no_proxy_table(no_proxy: str, url: str, bypass: bool, curl: bool) -> None:
    for variable in ("no_proxy", "NO_PROXY"):
        env = {"http_proxy": PROXY, "HTTPS_PROXY": PROXY, variable: no_proxy}
        assert (_http.proxy_for(url, env) is None) is bypass, (variable, no_proxy, url)


def test_lower_case_wins_and_an_empty_value_clears() -> None:
    url = "https://collector.example/"
    assert _http.proxy_for(url, {"https_proxy": PROXY, "no_proxy": "collector.example", "NO_PROXY": ""}) is None
    assert _http.proxy_for(url, {"https_proxy": PROXY, "no_proxy": "", "NO_PROXY": "collector.example"}) == PROXY


def _curl_tries(no_proxy: str, url: str) -> str:
    """The address curl tries first for ``url`` with ``https_proxy``/``http_proxy`` = :data:`PROXY` and
    ``no_proxy``, in an empty network namespace (nothing can leave it) with names pinned to
    :data:`NAME_ADDRESS` (no resolver is asked)."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    pin: list[str] = []
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pin = ["--resolve", f"{host.rstrip('.')}:{port}:{NAME_ADDRESS}"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "http_proxy": PROXY, "https_proxy": PROXY}
    env["no_proxy"] = no_proxy
    result = subprocess.run(
        ["unshare", "-n", "curl", "-v", "-s", "-o", "/dev/null", "--connect-timeout", "1", *pin, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    for line in result.stderr.splitlines():
        if "Trying " in line:
            return line.split("Trying ", 1)[1].rsplit(":", 1)[0].strip("[]")
        if "Could not resolve host: " in line:  # going direct to a name not pinned (curl keeps a trailing dot)
            return line.split("Could not resolve host: ", 1)[1].strip()
    raise AssertionError(f"curl tried nothing: {result.stderr[-500:]!r}")


def test_curl_decides_the_same(figures: Figures) -> None:
    if not shutil.which("curl") or not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs curl, unshare and root (an empty network namespace)")
    rows = [p.values for p in NO_PROXY_TABLE if p.values[3]]
    disagree = []
    started = time.monotonic()
    for no_proxy, url, bypass, _ in rows:
        tried = _curl_tries(no_proxy, url)
        curl_bypass = tried != "192.0.2.1"
        if curl_bypass != bypass:
            disagree.append((no_proxy, url, tried))
    assert not disagree, disagree
    version = subprocess.run(["curl", "--version"], capture_output=True, text=True, check=False).stdout.split()[1]
    figures.row(
        fault="NO_PROXY in every form curl accepts",
        injected=f"{len(NO_PROXY_TABLE)} NO_PROXY/URL pairs (names, suffixes, dots, case, blanks, *, IPv4/IPv6, "
        f"CIDR, ports, loopback); {len(rows)} also run through curl {version} in an empty network namespace",
        trials=len(NO_PROXY_TABLE) + len(rows),
        worst_s=time.monotonic() - started,
        checked="the flusher's choice equals the table for no_proxy and NO_PROXY; curl chose the same in every "
        "shared row; loopback never proxied",
    )


# --- real processes --------------------------------------------------------------------------------------

ALL_PROXIES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _run_flusher(env: dict[str, str], prefix: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*(prefix or []), *flusher_cmd()], env=env, capture_output=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("host", "family", "tls"),
    [
        pytest.param("127.0.0.1", 4, False, id="127.0.0.1"),
        pytest.param("localhost", 4, False, id="localhost"),
        pytest.param("collector.localhost", 4, False, id="collector.localhost"),
        pytest.param("[::1]", 6, False, id="ipv6"),
        pytest.param("localhost", 6, False, id="localhost-on-ipv6-only"),
        pytest.param("localhost", 4, True, id="https-localhost"),
    ],
)
def test_loopback_never_goes_through_a_proxy(
    sandbox: Sandbox, tmp_path: Path, figures: Figures, host: str, family: int, tls: bool
) -> None:
    extra: dict[str, str] = {}
    ca = None
    if tls:
        import trustme

        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        extra["SSL_CERT_FILE"] = str(tmp_path / "ca.pem")
    with contextlib.ExitStack() as stack:
        sock = ipv6_loopback_socket() if family == 6 else None
        server = stack.enter_context(Server(tls=ca, sock=sock))
        proxy = stack.enter_context(Proxy(("127.0.0.1", server.port)))
        env = with_destination(sandbox.env, server.url(host=host), **extra)
        env.update(dict.fromkeys(ALL_PROXIES, proxy.url()))
        env["NO_PROXY"] = env["no_proxy"] = "other.example"
        fill(APP, sandbox.env, 3)
        ids = set(ids_in(spool_bytes(sandbox.state_dir(APP))))
        started = time.monotonic()
        result = _run_flusher(env)
        took = time.monotonic() - started
    assert proxy.requests == [], "events for a loopback collector went through the proxy"
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b""), result
    assert set(server.event_ids()) == ids
    assert not ids_in(spool_bytes(sandbox.state_dir(APP)))
    figures.row(
        fault=f"proxy variables set, collector on {'https' if tls else 'http'}://{host} (IPv{family})",
        injected="http_proxy, HTTP_PROXY, https_proxy, HTTPS_PROXY, all_proxy, ALL_PROXY = a recording loopback "
        "proxy; NO_PROXY naming another host; the detached flusher",
        trials=1,
        recorded=len(ids),
        delivered=len(set(server.event_ids())),
        lost=len(ids) - len(set(server.event_ids())),
        worst_s=took,
        checked="0 requests reached the proxy; every event stored by the collector; flusher exit 0, silent",
    )


@pytest.mark.serial
def test_localhost_names_never_reach_a_resolver(sandbox: Sandbox, tmp_path: Path, figures: Figures) -> None:
    with silent_dns(tmp_path) as resolver, Server() as server:
        env = with_destination(sandbox.env, server.url(host="collector.localhost"))
        fill(APP, sandbox.env, 2)
        ids = set(ids_in(spool_bytes(sandbox.state_dir(APP))))
        started = time.monotonic()
        result = _run_flusher(env, resolver.prefix)
        took = time.monotonic() - started
        names = [q for q in resolver.queries if b"localhost" in q]
        # The control: a process in the same kind of namespace does ask this resolver (then it is ended).
        probe = subprocess.Popen(
            [*resolver.prefix, sys.executable, "-c", "import socket; socket.getaddrinfo('collector.invalid', 80)"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: bool(resolver.queries), timeout=20, what="the probe's query")
        finally:
            probe.kill()
            probe.wait(timeout=30)
    assert names == [], "a *.localhost name was sent to DNS"
    assert result.returncode == 0, result
    assert set(server.event_ids()) == ids
    assert {r.headers.get("host") for r in server.received} == {f"collector.localhost:{server.port}"}
    figures.row(
        fault="*.localhost endpoint with a resolver that never answers",
        injected="http://collector.localhost:PORT; /etc/resolv.conf -> a silent 127.0.0.1:53 in a private mount "
        "namespace (a probe proves the flusher's namespace asks it)",
        trials=1,
        recorded=len(ids),
        delivered=len(set(server.event_ids())),
        lost=len(ids) - len(set(server.event_ids())),
        worst_s=took,
        checked="0 DNS queries for the name; delivered to 127.0.0.1 with Host: collector.localhost",
    )
