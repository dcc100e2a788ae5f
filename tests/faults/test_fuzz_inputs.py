"""Input fuzzing (hypothesis) of what ``tests/client/test_fuzz_parsers.py`` and
``tests/collector/test_collector.py`` do not fuzz yet: ``Retry-After``, the flusher's state file, segment names
and counters with any Unicode digits, the collector's WSGI input streams, and raw HTTP responses read by the
flusher's sender from a loopback socket.
No exception escapes; time and memory stay bounded."""

from __future__ import annotations

import io
import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spool_reporter import _counters, _files, _hook, _http, _settings, _spool, _state
from spool_reporter._hook import django_app
from spool_reporter.collector import make_app
from spool_reporter.transports import Request

from ._helpers import Figures, scale

pytestmark = [pytest.mark.timeout(600), pytest.mark.serial]  # each call's worst time is asserted (docs/testing.md)

APP = django_app("5.2")
EXAMPLES = scale("fuzz_examples")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
DIGITS = st.sampled_from(["0", "7", "²", "٣", "৪", "①", "𝟗", "߃"])  # noqa: RUF001 - ASCII and non-ASCII Unicode digits


class Tally:
    def __init__(self) -> None:
        self.calls = 0
        self.worst = 0.0
        self.peak = 0
        self.known: dict[str, str] = {}
        self.failures: list[str] = []

    def call(self, fn: Callable[[], Any], *, known: Callable[[BaseException], str | None] | None = None) -> Any:
        self.calls += 1
        tracemalloc.start()
        started = time.perf_counter()
        try:
            return fn()
        except Exception as exc:
            why = known(exc) if known else None
            if why:
                self.known.setdefault(why, repr(exc)[:120])
            else:
                self.failures.append(repr(exc)[:300])
            return None
        finally:
            self.worst = max(self.worst, time.perf_counter() - started)
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()


def _non_ascii_digit(exc: BaseException) -> str | None:
    text = str(exc)
    if isinstance(exc, ValueError) and "invalid literal for int()" in text and not text.isascii():
        return "a non-ASCII Unicode digit passes str.isdigit() and then breaks int()"
    return None


def _report(figures: Figures, tally: Tally, fault: str, injected: str, time_bound: float, mem_bound: int) -> None:
    assert not tally.failures, tally.failures[:5]
    assert tally.worst < time_bound, tally.worst
    assert tally.peak < mem_bound, tally.peak
    known = "; ".join(f"KNOWN BUG: {why} ({example})" for why, example in tally.known.items())
    figures.row(
        fault=f"input: {fault}",
        injected=injected,
        trials=tally.calls,
        worst_s=tally.worst,
        checked=(known + ". Otherwise: " if known else "")
        + f"no exception escaped; peak memory per call {tally.peak / 1024:.0f} KiB",
    )


def test_retry_after(figures: Figures) -> None:
    tally = Tally()
    header = st.one_of(
        st.text(max_size=60),
        st.binary(max_size=60).map(lambda b: b.decode("latin-1")),  # how http.client decodes a header
        st.lists(DIGITS, min_size=1, max_size=30).map("".join),
        st.sampled_from(["Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 1994 08:49:37", "9" * 400, " 12 ", "-0"]),
    )

    @FUZZ
    @given(header, st.floats(min_value=0, max_value=4e9))
    def check(value: str, now: float) -> None:
        got = tally.call(lambda: _http.parse_retry_after(value, now), known=_non_ascii_digit)
        assert got is None or (isinstance(got, float) and got >= 0)

    check()
    _report(
        figures, tally, "Retry-After header", "hypothesis: text, latin-1 bytes, Unicode digit runs, dates", 0.5, 1 << 20
    )


def test_segment_names_and_counters(figures: Figures, tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally()
    folder_path = tmp_path_factory.mktemp("fuzz-counters")

    @FUZZ
    @given(
        st.lists(DIGITS, min_size=1, max_size=6).map(lambda d: f"seg-1-2-{''.join(d)}.jsonl"),
        st.lists(st.tuples(st.sampled_from(["cap", "corrupt", "rejected"]), st.lists(DIGITS, max_size=5)), max_size=4),
    )
    def check(name: str, counts: list[tuple[str, list[str]]]) -> None:
        tally.call(lambda: _spool.segment_count(name), known=_non_ascii_digit)
        (folder_path / "counters").write_text("".join(f"{k}={''.join(v)}\n" for k, v in counts), encoding="utf-8")
        os.chmod(folder_path / "counters", 0o600)
        with _hook.Folder(str(folder_path), create=False) as folder:
            tally.call(lambda: _counters.read_counters(folder), known=_non_ascii_digit)

    check()
    _report(
        figures,
        tally,
        "segment names and drop counters",
        "hypothesis: names and counter values built from ASCII and Unicode digits",
        0.5,
        1 << 20,
    )


def test_flusher_state_file(figures: Figures, tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally()
    home = tmp_path_factory.mktemp("fuzz-state")
    env = {"HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "config")}
    folder_path = home / "state" / "spool_reporter" / "django"
    _files.make_dirs(str(folder_path))
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=10,
    )
    keys = st.sampled_from(["last_flush", "last_result", "last_error", "next_retry", "consecutive_failures", "x"])
    documents = st.one_of(
        st.binary(max_size=300),
        st.dictionaries(keys, json_values, max_size=6).map(lambda d: __import__("json").dumps(d).encode()),
        st.sampled_from([b'{"consecutive_failures": 1e999}', b'{"next_retry": NaN}', b'{"last_flush": -1e300}']),
    )

    @FUZZ
    @given(documents)
    def check(data: bytes) -> None:
        path = folder_path / _state.STATE_NAME
        path.write_bytes(data)
        os.chmod(path, 0o600)
        tally.call(lambda: _state.read_state(APP, environ=env))
        with _hook.Folder(str(folder_path), create=False) as folder:
            tune = _settings.Tuning()
            tally.call(
                lambda: _state.record_outcome(folder, outcome="failed", error="x", retry_after=None, tune=tune, sent=0)
            )

    check()
    _report(
        figures,
        tally,
        "the flusher's state file",
        "hypothesis: random bytes and JSON documents as state.json, read by status and rewritten by a failed run",
        0.5,
        1 << 20,
    )


class _Stream:
    """A WSGI input stream that misbehaves: returns more than asked, raises, or trickles."""

    def __init__(self, data: bytes, mode: str) -> None:
        self.data = io.BytesIO(data)
        self.mode = mode

    def read(self, size: int = -1) -> bytes:
        if self.mode == "raises":
            raise OSError("connection reset")
        if self.mode == "overread":
            return self.data.read(-1 if size < 0 else size * 2)
        return self.data.read(1 if size != 0 else 0)


def test_collector_input_streams(figures: Figures, tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally()
    app = make_app(tmp_path_factory.mktemp("fuzz-wsgi") / "c.sqlite3")

    @FUZZ
    @given(
        st.binary(max_size=2000),
        st.sampled_from(["raises", "overread", "trickle"]),
        st.one_of(st.none(), st.integers(-5, 3000).map(str), st.text(max_size=6)),
        st.booleans(),
    )
    def check(body: bytes, mode: str, length: str | None, terminated: bool) -> None:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/v1/batch",
            "CONTENT_TYPE": "application/json",
            "wsgi.input": _Stream(body, mode),
            "wsgi.input_terminated": terminated,
        }
        if length is not None:
            environ["CONTENT_LENGTH"] = length
        statuses: list[str] = []
        out = tally.call(lambda: b"".join(app(environ, lambda s, h: statuses.append(s))))
        if out is not None:
            assert int(statuses[0].split()[0]) in (200, 400, 411, 413, 500)

    check()
    _report(
        figures,
        tally,
        "collector request bodies",
        "hypothesis: WSGI input streams that raise, over-read or trickle, with any Content-Length",
        1.0,
        8 << 20,
    )


class _RawServer:
    """A loopback server that answers every connection with the bytes set in ``reply``, then closes."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.reply = b""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_http_responses(figures: Figures) -> None:
    tally = Tally()
    server = _RawServer()
    url = f"http://127.0.0.1:{server.sock.getsockname()[1]}/v1/batch"
    tune = _settings.Tuning(deadline=2, connect_timeout=0.5, read_timeout=0.5)
    request = Request(
        method="POST", url=url, url_redacted=url, headers={"Content-Type": "application/json"}, body=b"{}"
    )
    status_lines = st.sampled_from(
        [
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 429 Too Many",
            b"HTTP/1.0 503 x",
            b"HTTP/1.1 999 ?",
            b"HTTP/1.1 2000 OK",
            b"ICY 200 OK",
            b"",
        ]
    )
    headers = st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from([b"Retry-After", b"Content-Length", b"Transfer-Encoding", b"Content-Encoding"]),
                st.binary(max_size=20),
            ),
            st.tuples(st.binary(min_size=1, max_size=10), st.binary(max_size=20)),
        ),
        max_size=5,
    )

    try:

        @FUZZ
        @given(status_lines, headers, st.binary(max_size=300), st.booleans())
        def check(status: bytes, head: list[tuple[bytes, bytes]], body: bytes, garbage: bool) -> None:
            if garbage:
                server.reply = body
            else:
                server.reply = status + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in head) + b"\r\n" + body
            sender = _http.Sender(url, {}, tune, time.monotonic() + tune.deadline)
            try:
                answer = tally.call(lambda: sender.send(request), known=_non_ascii_digit)
            finally:
                sender.close()
            if answer is not None:
                assert answer.kind in ("ok", "drop", "retry")
                assert isinstance(answer.describe(), str)

        check()
    finally:
        server.close()
    _report(
        figures,
        tally,
        "HTTP responses",
        "hypothesis: status lines, headers (Retry-After, lengths, encodings) and bodies from a raw loopback "
        "socket, read by the flusher's sender",
        tune.deadline + 1,
        16 << 20,
    )


def test_tally_reports_unknown_failures() -> None:
    tally = Tally()
    tally.call(lambda: int("x"))
    assert tally.failures
