"""The hook: everything :func:`spool_reporter.record` runs inside the user's command, in one module."""

# Why one module, and why comments instead of docstrings:
#
# Every module a Django command imports costs ~0.25 M instructions of import machinery plus ~35 instructions per
# byte of its .pyc (measured with callgrind against `django-admin startproject`, docs/design-notes.md), and
# docstrings are part of the .pyc. The hook's import must stay well under 0.5 ms, so everything record() runs
# lives here, in sections, explained in comments (`#:` before a constant, as Sphinx reads them). The cold path
# (the flusher, the command line, the collector) imports what it shares with the hook from here, and keeps the
# rest in its own modules: _firstrun (client id and notice), _spool (sealing, caps, readers), _spawn (starting
# the flusher), _consent (the rules in words), _event (the validator).
#
# The sections, in order:
#   applications   App, django_app, the notice version
#   folders        platformdirs' answers, computed without importing platformdirs (tests/client/test_paths.py)
#   config files   the user's file (DEP 8's ~/.config/djangoanalytics) and a distributor's policy
#   consent        one pure decision, with the rule that made it
#   the event      the allowlisted fields, serialised as one JSON line
#   the spool      the folder, the lock, the append
#   record()       the hook itself
#   the spawn gate whether a flusher may start now
#
# Rules for this module: standard library only (os, sys, time, stat, fcntl -- modules a Django process already
# has); no filelock, urllib3, platformdirs, uuid, platform or json; no network, no name resolution, no fsync;
# never print except the one-time notice and the debug echo. Do not log here. The rest of the package is imported
# only inside functions, on rare paths (docs/design-notes.md, "Imports run one way").
#
# No `from __future__ import annotations` here or in the package's __init__: it imports the __future__ module,
# 0.55 M instructions that a Django process has not paid yet. Annotations are quoted instead.

import os
import stat
import sys
import time

from . import SpoolReporterError  # the package is imported already: no cost

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

# === applications: App, django_app, the notice version ==============================================================

#: The platformdirs application name of our state folder; each :class:`App` gets a subfolder of it.
STATE_APPNAME: "Final" = "spool_reporter"

NAME_CHARS: "Final" = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")

_VERSION_CHARS: "Final" = frozenset("0123456789.")

_PREFIX_CHARS: "Final" = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")

#: GA4 caps names at 40 characters; we use the same bound for application and event names.
MAX_NAME: "Final" = 40


def _check(value: "str", chars: "frozenset[str]", what: "str", limit: "int" = MAX_NAME) -> "str":
    if not isinstance(value, str) or not value or len(value) > limit or not set(value) <= chars:
        msg = f"{what} must be 1-{limit} characters from {''.join(sorted(chars))!r}, got {value!r}"
        raise ValueError(msg)
    return value


def coarse_version(version: "str", default: "str" = "0") -> "str":
    # ``'5.2.7'`` -> ``'5.2'``, ``'6.1.0-rc1'`` -> ``'6.1'``: the leading numbers of the first two parts, as the
    # allowlist keeps versions at major.minor (an application's, an OS release); ``default`` when there are none.
    digits = []
    for part in version.split(".")[:2]:
        num = ""
        for ch in part:
            if not "0" <= ch <= "9":
                break
            num += ch
        if not num:
            break
        digits.append(str(int(num)))
    return ".".join(digits) or default


class App:
    """An application whose command-line usage is reported.

    All parameters are keyword-only; instances are immutable.

    :param name: the display name sent as the application (``"Django"``).
    :param version: the application's version; only major.minor is kept (``"5.2.7"`` -> ``"5.2"``).
    :param slug: the subfolder of the state folder and the stem of derived names (default: ``name.lower()``).
    :param config_name: the user config / system policy file name (default: ``slug + "analytics"``).
    :param env_prefix: prefix of the switches ``<P>_NO_ANALYTICS``, ``<P>_ANALYTICS_DEBUG``,
        ``<P>_ANALYTICS_ENDPOINT``, ``<P>_ANALYTICS_TRANSPORT`` (default: ``slug.upper()``).
    :param cli_name: the command that manages reporting, named in the first-run notice.
    :param docs_url: where the notice points for details.
    :param endpoint: the integrator's default destination, a collector's ``/v1/batch`` URL; the
        environment, the user file and the policy override it. With no destination, nothing is recorded.
    :param transport: its wire format: ``"json"`` only.
    :param notice_revision: raise it when the tool sends somewhere new: the notice is shown again, once.
    :param default: the consent default where no system policy names one: ``"opt-out"`` (DEP 8's), ``"opt-in"``,
        ``"local"`` or ``"ask"`` (ask once at a terminal; docs/consent.md).
    :param ask_default: in ask mode, what Enter means: ``"yes"`` (DEP 8's opt-out) or ``"no"``.
    :param ask_after: in ask mode, ask at the Nth terminal run; the runs before it record and ask nothing.
    """

    __slots__ = (
        "ask_after",
        "ask_default",
        "cli_name",
        "config_name",
        "default",
        "docs_url",
        "endpoint",
        "env_prefix",
        "name",
        "notice_version",
        "slug",
        "transport",
        "version",
    )

    name: "str"
    version: "str"
    slug: "str"
    config_name: "str"
    env_prefix: "str"
    cli_name: "str"
    docs_url: "str"
    endpoint: "str | None"
    transport: "str"
    notice_version: "int"
    default: "str"
    ask_default: "str"
    ask_after: "int"

    def __init__(
        self,
        *,
        name: "str",
        version: "str",
        slug: "str | None" = None,
        config_name: "str | None" = None,
        env_prefix: "str | None" = None,
        cli_name: "str" = "django-spool",
        docs_url: "str" = "https://spool-reporter.readthedocs.io/",  # _cli_common.DOCS_URL, not imported (argparse)
        endpoint: "str | None" = None,
        transport: "str" = "json",
        notice_revision: "int" = 0,
        default: "str" = "opt-out",
        ask_default: "str" = "yes",
        ask_after: "int" = 1,
    ) -> "None":
        set_ = object.__setattr__
        set_(self, "name", _check(name, NAME_CHARS, "name"))
        set_(self, "version", coarse_version(str(version)))
        slug = _check(slug if slug is not None else name.lower(), NAME_CHARS, "slug")
        set_(self, "slug", slug)
        set_(self, "config_name", _check(config_name or slug + "analytics", NAME_CHARS, "config_name"))
        set_(
            self,
            "env_prefix",
            _check(env_prefix or slug.upper().replace("-", "_").replace(".", "_"), _PREFIX_CHARS, "env_prefix"),
        )
        set_(self, "cli_name", cli_name)
        set_(self, "docs_url", docs_url)
        set_(self, "endpoint", _check_endpoint(endpoint))
        if transport != "json":
            # GA4 and UA need credentials, which belong in the config file with their endpoint.
            msg = f"transport must be 'json' (a collector), got {transport!r}"
            raise ValueError(msg)
        set_(self, "transport", transport)
        if not isinstance(notice_revision, int) or notice_revision < 0:
            msg = f"notice_revision must be an int >= 0, got {notice_revision!r}"
            raise ValueError(msg)
        # The notice's version: the library's (what is collected) plus the integrator's (where it goes).
        set_(self, "notice_version", NOTICE_VERSION + notice_revision)
        if default not in (MODE_OPT_OUT, MODE_OPT_IN, MODE_LOCAL, MODE_ASK):
            msg = f"default must be 'opt-out', 'opt-in', 'local' or 'ask', got {default!r}"
            raise ValueError(msg)
        set_(self, "default", default)
        if ask_default not in ("yes", "no"):
            msg = f"ask_default must be 'yes' or 'no', got {ask_default!r}"
            raise ValueError(msg)
        set_(self, "ask_default", ask_default)
        if not isinstance(ask_after, int) or isinstance(ask_after, bool) or not 1 <= ask_after <= MAX_ASK_AFTER:
            msg = f"ask_after must be an int from 1 to {MAX_ASK_AFTER}, got {ask_after!r}"
            raise ValueError(msg)
        set_(self, "ask_after", ask_after)

    def __setattr__(self, key: "str", value: "object") -> "None":
        msg = "App is immutable"
        raise AttributeError(msg)

    def __repr__(self) -> "str":
        where = "" if self.endpoint is None else f", endpoint={self.endpoint!r}"
        return f"App(name={self.name!r}, version={self.version!r}, slug={self.slug!r}{where})"

    def __eq__(self, other: "object") -> "bool":
        if not isinstance(other, App):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> "int":
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    @property
    def env_disable(self) -> "str":
        # The environment variable that turns reporting off (DEP 8: ``DJANGO_NO_ANALYTICS``).
        return self.env_prefix + "_NO_ANALYTICS"

    @property
    def env_debug(self) -> "str":
        # Print the event on stderr instead of spooling it (DEP 8: ``DJANGO_ANALYTICS_DEBUG``).
        return self.env_prefix + "_ANALYTICS_DEBUG"

    @property
    def env_endpoint(self) -> "str":
        # Override the configured endpoint.
        return self.env_prefix + "_ANALYTICS_ENDPOINT"

    @property
    def env_transport(self) -> "str":
        # Override the configured transport.
        return self.env_prefix + "_ANALYTICS_TRANSPORT"


def _check_endpoint(endpoint: "str | None") -> "str | None":
    # A coarse check at construction, so an integrator's typo fails in their tests; _settings validates fully
    # (loopback-only http, no credentials in the URL) and status says why a URL is refused.
    if endpoint is None:
        return None
    if (
        not isinstance(endpoint, str)
        or not endpoint.startswith(("https://", "http://"))
        or not (endpoint.isascii() and endpoint.isprintable())
        or " " in endpoint
        or len(endpoint) > 2048
    ):
        msg = f"endpoint must be an https:// URL, got {endpoint!r}"
        raise ValueError(msg)
    return endpoint


def django_app(version: "str" = "0") -> "App":
    # The application DEP 8 is about: ``djangoanalytics``, ``DJANGO_NO_ANALYTICS``, ``DJANGO_ANALYTICS_DEBUG``.
    #
    # The version only matters for events; the command line passes the default. No default destination: Django
    # core would ship the DSF's collector here; the reference implementation records nothing until one is set.
    return App(name="Django", version=version, slug="django", config_name="djangoanalytics", env_prefix="DJANGO")


#: The first-run notice's version: bumped when what is collected changes (a field is added or changes meaning, as
#: SCHEMA_VERSION) or the notice promises something else. A user whose config file says an older notice_version=
#: sees the notice again, once, before the next event is recorded. Both only ever grow.
NOTICE_VERSION: "Final" = 1


#: The notice's two wordings, as ``notice_mode=`` records which one the user saw: ``send`` ("events are sent
#: later") and ``local`` ("events stay in a file on this machine and are never sent"). A user whose decision
#: moves from one to the other sees the other wording before the next event is recorded. A file written before
#: the mode was recorded has no ``notice_mode=``: it counts as ``send``, the only wording a user outside local
#: mode could have seen (a local-mode user is shown the local wording again, once).
NOTICE_SEND: "Final" = "send"

NOTICE_LOCAL: "Final" = "local"


def seen_notice_mode(user: "dict[str, str] | None") -> "str":
    # The notice wording this user last saw (notice_mode= in the user file); see NOTICE_SEND.
    return NOTICE_LOCAL if user is not None and user.get("notice_mode") == NOTICE_LOCAL else NOTICE_SEND


def seen_notice_version(user: "dict[str, str] | None") -> "int":
    # The notice version this user has seen: notice_version= in the user file; a client id without it is from
    # before notice versions, when creating the id printed version 1; 0 when nothing was shown.
    raw = None if user is None else user.get("notice_version")
    if raw is None:
        cid = None if user is None else user.get("client_id")
        return 1 if cid is not None and is_uuid4(cid) else 0
    return int(raw) if raw.isascii() and raw.isdigit() else 0


# === folders: platformdirs' answers without platformdirs ============================================================

# platformdirs costs ~2 ms to import inside a command; these few functions reproduce its answers for the three
# folders we use: user_config_dir() (the folder of `djangoanalytics`), site_config_dir(s)() (where a distributor's
# policy lives) and user_state_dir(app) (platformdirs' user_state_dir(app, appauthor=False)). tests/client/test_paths.py
# checks each against platformdirs itself under many environments, so hook, flusher and CLI agree on every file.

_MACOS: "Final" = sys.platform == "darwin"

_WINDOWS: "Final" = sys.platform == "win32"


def _home(environ: "Mapping[str, str]") -> "str":
    # platformdirs treats a relative HOME as unset and asks the password database instead.
    home = environ.get("HOME", "")
    if home.startswith("/"):
        return home
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def _xdg(environ: "Mapping[str, str]", var: "str") -> "str | None":
    # platformdirs only honours absolute XDG values (posixpath.isabs).
    value = environ.get(var, "")
    return value if value.startswith("/") else None


def _windows_folder(environ: "Mapping[str, str]", var: "str", which: "str") -> "str":  # pragma: no cover windows
    value = environ.get(var, "")
    if value:
        return os.path.normpath(value)
    import platformdirs  # the registry fallback is platformdirs' business; rare enough to pay for

    return str(getattr(platformdirs, which)())


def user_config_dir(environ: "Mapping[str, str] | None" = None) -> "str":
    # The user's configuration folder (no application part).
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover windows
        return _windows_folder(env, "LOCALAPPDATA", "user_config_dir")
    xdg = _xdg(env, "XDG_CONFIG_HOME")
    if xdg is not None:
        return xdg
    if _MACOS:  # pragma: no cover - macOS
        return os.path.join(_home(env), "Library", "Application Support")
    return os.path.join(_home(env), ".config")


def site_config_dirs(environ: "Mapping[str, str] | None" = None) -> "list[str]":
    # Every system-wide configuration folder, in order of preference: platformdirs'
    # site_config_dir(multipath=True), split. The XDG spec has several ($XDG_CONFIG_DIRS, e.g. Ubuntu's
    # "/etc/xdg/xdg-ubuntu:/etc/xdg"); a distributor's policy may sit in any of them.
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover windows
        return [_windows_folder(env, "PROGRAMDATA", "site_config_dir")]
    dirs = [entry for entry in env.get("XDG_CONFIG_DIRS", "").split(os.pathsep) if entry.startswith("/")]
    return dirs or ["/Library/Application Support" if _MACOS else "/etc/xdg"]


def user_state_dir(appname: "str", environ: "Mapping[str, str] | None" = None) -> "str":
    # The user's state folder for ``appname``.
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover windows
        return os.path.join(_windows_folder(env, "LOCALAPPDATA", "user_data_dir"), appname)
    xdg = _xdg(env, "XDG_STATE_HOME")
    if xdg is not None:
        return os.path.join(xdg, appname)
    if _MACOS:  # pragma: no cover - macOS
        return os.path.join(_home(env), "Library", "Application Support", appname)
    return os.path.join(_home(env), ".local", "state", appname)


# === config files: the user's file and a distributor's policy =======================================================

# DEP 8 keeps the user's choice in ~/.config/djangoanalytics; we keep its shape: one key=value a line, `#` or `;`
# comments, blank lines and [section] headers ignored (an INI-style file is read too). Reading never blocks on a
# FIFO, never reads more than MAX_CONFIG_BYTES, and reports a file it cannot trust as BROKEN, which the consent
# rules treat as "off". _userconf writes the user's file (enable, disable, reset-id), under its lock.

#: A config or policy file larger than this is not ours to trust (ours stay well under 1 KiB).
MAX_CONFIG_BYTES: "Final" = 16 * 1024

_OPEN_FLAGS: "Final" = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class _Broken(dict[str, str]):
    # The marker type of an unreadable, oversized, non-regular or malformed file.

    def __repr__(self) -> "str":
        return "BROKEN"


#: Returned instead of a mapping when a file exists but cannot be trusted.
BROKEN: "Final[dict[str, str]]" = _Broken()


def parse(data: "bytes") -> "dict[str, str] | None":
    # Parse file contents; ``None`` when they are malformed. The last occurrence of a key wins.
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or (line[0] == "[" and line[-1] == "]"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if not sep or not key or not key.replace("_", "").replace("-", "").isalnum() or not key.isascii():
            return None
        values[key.replace("-", "_")] = value.strip()
    return values


def read(path: "str") -> "dict[str, str] | None":
    # Read ``path``: a mapping, ``None`` when it does not exist, :data:`BROKEN` when it cannot be trusted.
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError:
        return BROKEN
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            return BROKEN
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError:
        return BROKEN
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        return BROKEN
    values = parse(data)
    return BROKEN if values is None else values


def is_broken(values: "dict[str, str] | None") -> "bool":
    # Whether :func:`read` found a file it could not trust.
    return values is BROKEN


# === consent: one pure decision, with the rule that made it =========================================================

# The order, first match wins (docs/consent.md explains each rule; _consent.REASON_TEXT words them):
#
#  1. <P>_NO_ANALYTICS set (not empty, not 0)              -> off  env:<P>_NO_ANALYTICS
#  2. DO_NOT_TRACK set (not empty, not 0)                   -> off  env:DO_NOT_TRACK
#  3. the system policy cannot be trusted                   -> off  policy:unreadable
#  4. the system policy says disable=1                      -> off  policy:disable
#  5. the user file cannot be trusted                       -> off  user:unreadable
#  6. the user file says disable=1                          -> off  user:disable
#  7. the user file says disable=0 (`enable` writes it)     -> on   user:enable
#     ... and mode=local (`enable --local` writes both)     -> on, local  user:local
#  8. a CI environment                                      -> off  ci:<VAR>
#  9. the system policy says default=off (opt-in mode)      -> off  policy:opt-in
# 10. the user file says mode=local                         -> on, local  user:local
# 11. the system policy says default=local                  -> on, local  policy:local
# 12. the system policy says default=ask (not answered yet) -> off  policy:ask  (the hook may ask: _ask)
# 13. otherwise (DEP 8's opt-out)                           -> on   default
#
# Where the system policy names no default=, the App's `default` stands in for it (rules 9, 11, 12: app:opt-in,
# app:local, app:ask). "Local" means recorded and kept on this machine, never sent. A sending "on" (7 and 13), and
# the question (12), need a destination: when neither <P>_ANALYTICS_ENDPOINT, the user file, the policy nor the App
# names an endpoint, nothing could ever be sent, so nothing is recorded -> off destination:none; and a destination
# that answered 410 Gone (its URL is in the user file's retired=, written by the flusher) is not sent to again ->
# off destination:retired. The system policy is the first <config_name> file found in the system configuration
# folders, in order (Linux: each entry of $XDG_CONFIG_DIRS, default /etc/xdg).

#: Environment variables whose presence marks a CI run (``CI=false``/``0`` does not count): the generic marker
#: most CI services set, then vendor-specific ones for those that do not.
CI_VARIABLES: "Final" = (
    "CI",
    "CONTINUOUS_INTEGRATION",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "TRAVIS",
    "CIRCLECI",
    "BUILDKITE",
    "TF_BUILD",
    "JENKINS_URL",
    "TEAMCITY_VERSION",
    "BITBUCKET_BUILD_NUMBER",
    "CODEBUILD_BUILD_ID",
    "APPVEYOR",
    "DRONE",
    "SEMAPHORE",
    "HEROKU_TEST_RUN_ID",
    "BUILD_BUILDID",
    "WOODPECKER",
)

#: Reasons that mean the user or the system said no, or the destination retired itself: queued events are deleted,
#: not kept.
HARD_OFF_REASONS: "Final" = frozenset({"policy:disable", "user:disable", "destination:retired"})

#: The policy's default (``default=``, :attr:`Decision.mode`): opt-out (DEP 8's) unless it says otherwise.
MODE_OPT_OUT: "Final" = "opt-out"

#: ``default=off`` (or ``0``, ``no``, ``opt-in``): nothing is recorded until the user says yes.
MODE_OPT_IN: "Final" = "opt-in"

#: ``default=local``: events are recorded and kept on this machine, never sent.
MODE_LOCAL: "Final" = "local"

#: ``default=ask``: nothing is recorded until the user answers one question at a terminal (_ask asks it).
MODE_ASK: "Final" = "ask"

#: The decisions of ask mode that mean "nobody has answered yet" (rule 12): the hook may ask (_ask).
ASK_REASONS: "Final" = frozenset({"policy:ask", "app:ask"})

#: The largest ``ask_after=`` (policy or App): a bound, so that a typo cannot mean "never ask".
MAX_ASK_AFTER: "Final" = 100

#: The user file's key that lists (space-separated) the destinations that answered 410 Gone.
RETIRED_KEY: "Final" = "retired"


class Decision:
    # The outcome of :func:`decide`: ``enabled``, the ``reason`` (rule), the ``mode`` (the policy's default) and
    # ``local`` (events are recorded and kept on this machine, never sent).

    __slots__ = ("enabled", "local", "mode", "reason")

    enabled: "bool"
    reason: "str"
    mode: "str"
    local: "bool"

    def __init__(self, *, enabled: "bool", reason: "str", mode: "str", local: "bool" = False) -> "None":
        object.__setattr__(self, "enabled", enabled)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "local", local)

    def __setattr__(self, key: "str", value: "object") -> "None":
        msg = "Decision is immutable"
        raise AttributeError(msg)

    def __repr__(self) -> "str":
        local = ", local=True" if self.local else ""
        return f"Decision(enabled={self.enabled!r}, reason={self.reason!r}, mode={self.mode!r}{local})"

    def __eq__(self, other: "object") -> "bool":
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.enabled, self.reason, self.mode, self.local) == (
            other.enabled,
            other.reason,
            other.mode,
            other.local,
        )

    def __hash__(self) -> "int":
        return hash((self.enabled, self.reason, self.mode, self.local))

    @property
    def hard_off(self) -> "bool":
        # Off because someone said no (env, user file, policy): queued events must be deleted.
        return not self.enabled and (self.reason.startswith("env:") or self.reason in HARD_OFF_REASONS)


def truthy(value: "str | None") -> "bool":
    return value is not None and value.strip() not in ("", "0")


def _ci_variable(environ: "Mapping[str, str]") -> "str | None":
    for name in CI_VARIABLES:
        value = environ.get(name)
        if value is not None and value.strip().lower() not in ("", "0", "false", "no"):
            return name
    return None


def decide(
    app: "App",
    environ: "Mapping[str, str]",
    user: "dict[str, str] | None",
    policy: "dict[str, str] | None",
) -> "Decision":
    # Decide from already-read inputs. Pure: no I/O. ``None`` means "no such file".
    default = "" if policy is None else policy.get("default", "").strip().lower()
    who = "policy:"
    if not default:
        default = app.default
        who = "app:"
    mode = (
        MODE_OPT_IN
        if default in ("off", "0", "opt-in", "no")
        else MODE_LOCAL
        if default == "local"
        else MODE_ASK
        if default == "ask"
        else MODE_OPT_OUT
    )
    user_local = user is not None and user.get("mode", "").strip().lower() == "local"

    def off(reason: "str") -> "Decision":
        return Decision(enabled=False, reason=reason, mode=mode)

    def nowhere() -> "str | None":
        # Why no event could leave: no destination from any source, or the one named retired itself (410).
        endpoint = effective_endpoint(app, environ, user, policy)
        if not endpoint:
            return "destination:none"
        retired = None if user is None else user.get(RETIRED_KEY)
        if retired is not None and endpoint in retired.split():
            return "destination:retired"
        return None

    def on(reason: "str", local: "bool" = False) -> "Decision":
        # Nothing is recorded that could never leave: with no destination from any source, reporting is off --
        # unless the events are to stay here (local mode), where no destination is needed.
        why = None if local else nowhere()
        if why is not None:
            return off(why)
        return Decision(enabled=True, reason=reason, mode=mode, local=local)

    if truthy(environ.get(app.env_disable)):
        return off("env:" + app.env_disable)
    if truthy(environ.get("DO_NOT_TRACK")):
        return off("env:DO_NOT_TRACK")
    if is_broken(policy):
        return off("policy:unreadable")
    if policy is not None and policy.get("disable", "").strip() not in ("", "0"):
        return off("policy:disable")
    if is_broken(user):
        return off("user:unreadable")
    user_disable = None if user is None else user.get("disable")
    if user_disable is not None and user_disable.strip() not in ("", "0"):
        return off("user:disable")
    if user_disable is not None and user_disable.strip() == "0":
        return on("user:local", True) if user_local else on("user:enable")
    ci = _ci_variable(environ)
    if ci is not None:
        return off("ci:" + ci)
    if mode == MODE_OPT_IN:
        return off(who + "opt-in")
    if user_local:
        return on("user:local", True)
    if mode == MODE_LOCAL:
        return on(who + "local", True)
    if mode == MODE_ASK:
        return off(nowhere() or who + "ask")
    return on("default")


def user_config_path(app: "App", environ: "Mapping[str, str] | None" = None) -> "str":
    # The user's config file (DEP 8: ``~/.config/djangoanalytics``).
    return os.path.join(user_config_dir(environ), app.config_name)


def policy_paths(app: "App", environ: "Mapping[str, str] | None" = None) -> "list[str]":
    # Where a distributor's policy file may be, most preferred first (Linux: /etc/xdg/djangoanalytics).
    return [os.path.join(d, app.config_name) for d in site_config_dirs(environ)]


def read_policy(app: "App", environ: "Mapping[str, str] | None" = None) -> "tuple[str, dict[str, str] | None]":
    # The first policy file that exists (its path and contents), like an XDG config lookup; else the most
    # preferred path and None. One failed open per configured folder when there is none.
    paths = policy_paths(app, environ)
    for path in paths:
        values = read(path)
        if values is not None:
            return path, values
    return paths[0], None


def read_inputs(
    app: "App", environ: "Mapping[str, str] | None" = None
) -> "tuple[dict[str, str] | None, dict[str, str] | None]":
    # Read the user file and the policy file (each ``None``, a mapping, or ``BROKEN``).
    return read(user_config_path(app, environ)), read_policy(app, environ)[1]


# === the event: the allowlisted fields as one JSON line =============================================================

# Exactly the allowlisted fields (_event.FIELDS; docs/what-is-sent.md), without importing json. `uuid` and
# `platform` cost ~1 ms to import, more than the hook's whole budget, so uuid4 and the OS facts are computed here
# with os.urandom, os.uname and sys.implementation; tests/client/test_event.py checks them against uuid and platform.
# _event holds the validator that the flusher and the collector both apply.

#: Bumped when a field is added, removed or changes meaning.
SCHEMA_VERSION: "Final" = 1

_EVENT_CHARS: "Final" = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")

_HEX: "Final" = frozenset("0123456789abcdef")


def uuid4() -> "str":
    # A random RFC 4122 version-4 UUID in canonical text form (never uuid1: no MAC address).
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid4(text: "str") -> "bool":
    # Whether ``text`` is a canonical lower-case version-4 UUID.
    return (
        isinstance(text, str)
        and len(text) == 36
        and text[8] == text[13] == text[18] == text[23] == "-"
        and text[14] == "4"
        and text[19] in "89ab"
        and set(text.replace("-", "")) <= _HEX
        and len(text.replace("-", "")) == 32
    )


def is_event_name(name: "str") -> "bool":
    # GA4's rule for names: ``[A-Za-z][A-Za-z0-9_]*``, at most 40 characters.
    return isinstance(name, str) and 0 < len(name) <= 40 and name[0].isalpha() and set(name) <= _EVENT_CHARS


def _python() -> "tuple[str, str]":
    impl = sys.implementation.name
    names = {"cpython": "CPython", "pypy": "PyPy", "graalpy": "GraalPy"}
    return names.get(impl, impl[:16].capitalize() or "Python"), f"{sys.version_info[0]}.{sys.version_info[1]}"


#: Machine names folded to a small, fixed vocabulary (anything else is ``"other"``).
ARCH: "Final" = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "x64": "x86_64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv8l": "arm64",
    "i386": "x86",
    "i486": "x86",
    "i586": "x86",
    "i686": "x86",
    "x86": "x86",
    "armv7l": "arm",
    "armv6l": "arm",
    "arm": "arm",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loongarch64": "loongarch64",
}


def _os() -> "tuple[str, str, str]":
    if sys.platform == "win32":  # pragma: no cover windows
        ver = sys.getwindowsversion()
        release = "11" if ver.major == 10 and ver.build >= 22000 else f"{ver.major}.{ver.minor}"
        # Like platform.machine(): the native architecture, even in a 32-bit process on a 64-bit OS.
        machine = os.environ.get("PROCESSOR_ARCHITEW6432") or os.environ.get("PROCESSOR_ARCHITECTURE", "")
        return "Windows", release if release != "10.0" else "10", ARCH.get(machine.lower(), "other")
    u = os.uname()
    arch = ARCH.get(u.machine.lower(), "other")
    if sys.platform == "darwin":  # pragma: no cover - macOS
        darwin = int(coarse_version(u.release, "unknown").split(".")[0] or 0)
        # Darwin 20-24 are macOS 11-15; Darwin 25 is macOS 26 (the year-based numbering).
        macos = str(darwin + 1) if darwin >= 25 else str(darwin - 9) if darwin >= 20 else f"10.{darwin - 4}"
        return "macOS", macos, arch
    family = {"linux": "Linux", "freebsd": "FreeBSD", "openbsd": "OpenBSD", "netbsd": "NetBSD"}.get(
        u.sysname.lower(), "other"
    )
    return family, coarse_version(u.release, "unknown"), arch


_STATIC: "tuple[str, str, str, str, str] | None" = None


def platform_facts() -> "tuple[str, str, str, str, str]":
    # (python, python_version, os, os_release, arch), computed once per process.
    global _STATIC
    if _STATIC is None:
        impl, pyver = _python()
        family, release, arch = _os()
        _STATIC = (impl, pyver, family, release, arch)
    return _STATIC


def user_agent(app: "App") -> "str":
    impl, pyver, family, _, arch = platform_facts()
    return format_user_agent(app.name, app.version, impl=impl, pyver=pyver, family=family, arch=arch)


def format_user_agent(app: "str", version: "str", *, impl: "str", pyver: "str", family: "str", arch: "str") -> "str":
    # DEP 8's User-Agent: ``Django/5.2 CPython/3.11 (Linux; x86_64)``. The collector rebuilds it the same way
    # for GA4 payloads, which do not carry it.
    return f"{app}/{version} {impl}/{pyver} ({family}; {arch})"


def quote(value: "str") -> "str":
    # The values are built from fixed vocabularies and validated names; escape anyway, like json.dumps would
    # with ensure_ascii=True, so that a surprising value can never break the line.
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return '"' + value + '"'
    out = []
    for ch in value:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code > 0x7E:
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def iso_time(epoch: "float") -> "str":
    # UTC ISO 8601 with whole seconds: ``2026-12-03T08:15:48Z``.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


_FIXED_FIELDS: "dict[App, str]" = {}


def _fixed_fields(app: "App") -> "str":
    # The fields that do not change within a process, serialised once.
    cached = _FIXED_FIELDS.get(app)
    if cached is None:
        impl, pyver, family, release, arch = platform_facts()
        q = quote
        cached = (
            f'"app":{q(app.name)},"app_version":{q(app.version)},"python":{q(impl)},'
            f'"python_version":{q(pyver)},"os":{q(family)},"os_release":{q(release)},"arch":{q(arch)},'
            f'"user_agent":{q(user_agent(app))},'
        )
        _FIXED_FIELDS[app] = cached
    return cached


def build_line(app: "App", event: "str", client_id: "str", now: "float") -> "bytes":
    # One spool line (JSON object + newline) holding exactly :data:`FIELDS`, in that order.
    q = quote
    return (
        f'{{"schema":{SCHEMA_VERSION},"event_id":"{uuid4()}","event":{q(event)},{_fixed_fields(app)}'
        f'"client_id":{q(client_id)},"time":"{iso_time(now)}"}}\n'
    ).encode("ascii")


# === the spool: the folder, the lock, the append ====================================================================

# <user state dir>/spool_reporter/<slug>/ (folder 0700, files 0600): the hook appends one line per event to
# spool.jsonl under an exclusive flock on spool.lock (the same flock filelock takes: tests/client/test_lock_interop.py),
# and seals the file into a segment at SEGMENT_BYTES; _spool has the rest (the layout, caps, readers, recovery).
# Nothing planted at a name of ours is followed: the folder is opened through descriptors (Folder), and every
# file with O_NOFOLLOW, checked to be a regular file of ours (open_ours).

LOCK_NAME: "Final" = "spool.lock"

ACTIVE_NAME: "Final" = "spool.jsonl"

COUNTERS_NAME: "Final" = "counters"

SEGMENT_PREFIX: "Final" = "seg-"

SEGMENT_SUFFIX: "Final" = ".jsonl"

#: The active file is sealed at this size: ~600 events; counting its lines then reads 256 KiB (~60 us).
SEGMENT_BYTES: "Final" = 256 * 1024

#: Default count cap: a year of a busy developer's commands, and the flusher benchmark's queue.
MAX_EVENTS: "Final" = 10_000

#: Default byte cap: 10,000 events of ~420 bytes fit twice over; a small price on any disk.
MAX_BYTES: "Final" = 8 * 1024 * 1024

#: An active file this large was not written by us (we seal at SEGMENT_BYTES): it is discarded.
HUGE_ACTIVE_BYTES: "Final" = 4 * SEGMENT_BYTES

#: The hook gives up on a lock held this long (a flusher's claim is a rename: microseconds).
LOCK_WAIT_SECONDS: "Final" = 0.005

#: At most this many one-line segments written beside a busy lock (see :func:`append_aside`).
MAX_ASIDE: "Final" = 1000

FILE_MODE: "Final" = 0o600

DIR_MODE: "Final" = 0o700


O_CLOEXEC: "Final" = getattr(os, "O_CLOEXEC", 0)

O_NOFOLLOW: "Final" = getattr(os, "O_NOFOLLOW", 0)

O_NONBLOCK: "Final" = getattr(os, "O_NONBLOCK", 0)

O_DIRECTORY: "Final" = getattr(os, "O_DIRECTORY", 0)

O_BINARY: "Final" = getattr(os, "O_BINARY", 0)

DIR_FD: "Final" = (not _WINDOWS) and os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd

UID: "Final" = os.geteuid() if hasattr(os, "geteuid") else None

LOCK_FLAGS: "Final" = os.O_RDWR | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_BINARY

#: O_RDWR, not O_WRONLY: the append reads the last byte back to detect a torn line.
_APPEND_FLAGS: "Final" = os.O_RDWR | os.O_APPEND | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_BINARY

READ_FLAGS: "Final" = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_BINARY


class SpoolError(SpoolReporterError, OSError):
    # The spool folder or one of its files is not safe to use (symlink, wrong owner, not a file): an OSError to
    # the code that handles unusable folders, and a SpoolReporterError like every exception the package raises.
    pass


def trusted_file(st: "os.stat_result") -> "bool":
    # A regular file we own with exactly one name: a hard link planted at our path could point anywhere.
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (UID is None or st.st_uid == UID)


DIR_FLAGS: "Final" = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC

#: The last two levels of a spool folder (``spool_reporter/<slug>``) are ours: real folders we own, 0700, never
#: a symlink of any owner. Above them, a symlink is followed only if root or we own it: another user cannot make
#: us walk into a folder of their choosing (``/home -> /var/home`` still works). The walk that checks all this,
#: level by level through descriptors, is _files.open_dirs; Folder takes it only when _known_folder cannot.
OWN_LEVELS: "Final" = 2

#: The local-mode spool (LOCAL_FOLDER) is one level deeper: its last three levels are ours.
LOCAL_OWN_LEVELS: "Final" = OWN_LEVELS + 1

#: The marker ``.verified-<dev>-<inode>`` that Folder leaves in a folder a full walk verified (_known_folder).
VERIFIED_PREFIX: "Final" = ".verified-"


def _known_folder(path: "str") -> "int | None":
    # The fast way in: the folder opened in one step, used only if it is the very folder a full walk (open_dirs)
    # verified before -- it holds the marker ``.verified-<dev>-<inode>`` that Folder leaves after a walk. A folder's
    # inode has one name, so whatever path led here (a link swapped in above it included), this is that folder.
    # Three system calls instead of two per level; None sends the caller on the walk.
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (UID is None or st.st_uid == UID) and not st.st_mode & 0o077:
            os.stat(f"{VERIFIED_PREFIX}{st.st_dev}-{st.st_ino}", dir_fd=fd, follow_symlinks=False)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class Folder:
    # An open, verified spool folder: operations are relative to a descriptor, so a symlink swapped in
    # for the folder after the check cannot redirect them. Use as a context manager.

    __slots__ = ("fd", "path")

    path: "str"
    fd: "int | None"

    def __init__(self, path: "str", *, create: "bool", own: "int" = OWN_LEVELS) -> "None":
        self.path = path
        self.fd = None
        if not DIR_FD:  # pragma: no cover windows
            if create:
                from ._files import make_dirs

                make_dirs(path)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise SpoolError(f"not a folder: {path}")
            return
        fd = _known_folder(path)
        if fd is None:
            from ._files import open_dirs  # rare: a first run, or a folder not verified yet

            fd = open_dirs(path, create=create, own=own)
            try:
                st = os.fstat(fd)
                marker = f"{VERIFIED_PREFIX}{st.st_dev}-{st.st_ino}"
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC, FILE_MODE, dir_fd=fd))
            except OSError:  # a read-only folder: the walk, every time
                pass
        self.fd = fd

    def close(self) -> "None":
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc: "object") -> "None":
        self.close()

    def _name(self, name: "str") -> "str":
        return name if self.fd is not None else os.path.join(self.path, name)

    def open(self, name: "str", flags: "int", mode: "int" = FILE_MODE) -> "int":
        if self.fd is not None:
            return os.open(name, flags, mode, dir_fd=self.fd)
        return os.open(os.path.join(self.path, name), flags, mode)  # pragma: no cover windows

    def rename(self, src: "str", dst: "str") -> "None":
        if self.fd is not None:
            os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:  # pragma: no cover windows
            os.replace(os.path.join(self.path, src), os.path.join(self.path, dst))

    def unlink(self, name: "str") -> "None":
        if self.fd is not None:
            os.unlink(name, dir_fd=self.fd)
        else:  # pragma: no cover windows
            os.unlink(os.path.join(self.path, name))

    def lstat(self, name: "str") -> "os.stat_result":
        if self.fd is not None:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        return os.lstat(os.path.join(self.path, name))  # pragma: no cover windows


if sys.platform == "win32":  # pragma: no cover windows
    import msvcrt

    def try_lock(fd: "int") -> "bool":
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def try_lock(fd: "int") -> "bool":
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True


def take_lock(fd: "int", wait: "float" = LOCK_WAIT_SECONDS) -> "bool":
    # Take the exclusive OS lock on ``fd``, waiting at most ``wait`` seconds (bounded, never forever).
    if try_lock(fd):
        return True
    deadline = time.monotonic() + wait
    pause = 0.0002
    while time.monotonic() < deadline:
        time.sleep(pause)
        if try_lock(fd):
            return True
        pause = min(pause * 2, 0.001)
    return False


def open_ours(folder: "Folder", name: "str", flags: "int") -> "tuple[int, os.stat_result]":
    # Open (and create) file ``name`` of the spool folder: ``(descriptor, fstat)``. Whatever sits there that is
    # not a regular file of ours -- a symlink, a folder, a FIFO, a hard link, another user's file -- is never
    # followed or written: it is set aside and a fresh file made (rare, so that code is _files.reopen). Raises
    # OSError when the file cannot be opened at all (a read-only or full disk).
    try:
        fd = folder.open(name, flags)
    except OSError:
        try:
            planted = not trusted_file(folder.lstat(name))
        except OSError:
            planted = False
        if not planted:
            raise
    else:
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if trusted_file(st):
            return fd, st
        os.close(fd)
    from ._files import reopen

    return reopen(folder, name, flags)


def lock_fd(folder: "Folder", wait: "float" = LOCK_WAIT_SECONDS) -> "int | None":
    # Open ``spool.lock`` and take the exclusive lock, waiting at most ``wait`` seconds.
    #
    # Returns the descriptor (closing it releases the lock) or ``None`` when the lock is busy.
    fd = open_ours(folder, LOCK_NAME, LOCK_FLAGS)[0]
    try:
        if take_lock(fd, wait):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def append(folder: "Folder", line: "bytes", *, max_events: "int" = MAX_EVENTS, max_bytes: "int" = MAX_BYTES) -> "int":
    # Append one line under the lock (taken and released here). Returns the active file's new size.
    #
    # Raises :class:`OSError` (including :class:`SpoolError`) on any failure; the hook turns that into a no-op.
    lfd = lock_fd(folder)
    if lfd is None:
        from ._spool import append_aside  # rare: the lock stayed busy

        return append_aside(folder, line)
    try:
        fd, st = open_ours(folder, ACTIVE_NAME, _APPEND_FLAGS)
        try:
            if st.st_size >= SEGMENT_BYTES:
                os.close(fd)
                fd = -1
                from ._spool import enforce_caps, seal_active  # rare: once per segment

                seal_active(folder)
                enforce_caps(folder, max_events, max_bytes)
                fd, st = open_ours(folder, ACTIVE_NAME, _APPEND_FLAGS)
            if st.st_mode & 0o077:
                os.fchmod(fd, FILE_MODE)
            size = st.st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a torn last line stays alone: it costs that line only
            try:
                written = os.write(fd, line)
            except OSError:
                os.ftruncate(fd, size)
                raise
            if written != len(line):
                os.ftruncate(fd, size)
                raise OSError("short write")
            return size + written
        finally:
            if fd >= 0:
                os.close(fd)
    finally:
        os.close(lfd)


# === record(): the hook itself ======================================================================================

#: Set in the flusher's environment: nothing is recorded from inside it or its children (no recursion).
FLUSHER_ENV: "Final" = "SPOOL_REPORTER_FLUSHER"


def state_dir(app: "App", environ: "Mapping[str, str] | None" = None) -> "str":
    # The app's spool folder: ``<user state dir>/spool_reporter/<slug>``.
    return os.path.join(user_state_dir(STATE_APPNAME, environ), app.slug)


#: The subfolder of the spool folder that holds the events recorded in local mode: a spool of its own (same
#: files, lock and caps), which no flusher reads. Its last three levels are ours (LOCAL_OWN_LEVELS).
LOCAL_FOLDER: "Final" = "local"


def local_dir(app: "App", environ: "Mapping[str, str] | None" = None) -> "str":
    # The app's local-mode folder: ``<user state dir>/spool_reporter/<slug>/local``.
    return os.path.join(state_dir(app, environ), LOCAL_FOLDER)


def ensure_client_id(
    app: "App",
    user: "dict[str, str] | None",
    environ: "Mapping[str, str]",
    notice: "bool" = False,
    local: "bool" = False,
) -> "tuple[str, bool] | None":
    # The client id from the user file, creating it on first use: ``(id, show the notice now)`` or ``None``.
    #
    # The notice is due when the user has not seen this App's notice_version (a first run, or what is collected
    # changed), or saw the other wording (``local``: this event stays on this machine; see NOTICE_SEND). Creating
    # the id and recording notice_version= and notice_mode= happen under an exclusive lock on the config file
    # itself, re-reading it first, so several commands started together agree on one id and exactly one of them
    # prints the notice (notice=True only: a caller that prints none records none as seen).
    cid = None if user is None else user.get("client_id")
    if (
        cid is not None
        and is_uuid4(cid)
        and (
            not notice
            or (
                seen_notice_version(user) >= app.notice_version
                and seen_notice_mode(user) == (NOTICE_LOCAL if local else NOTICE_SEND)
            )
        )
    ):
        return cid, False
    from ._firstrun import create_client_id  # first run (or a new notice) only: not worth importing every time

    return create_client_id(app, environ, notice=notice, local=local)


def int_setting(values: "dict[str, str] | None", key: "str", default: "int") -> "int":
    raw = None if values is None else values.get(key)
    if raw is None or not (raw.isascii() and raw.isdigit()):  # isdigit() alone accepts '²'
        return default
    return max(1, int(raw))


def record_event(
    event: "str",
    *,
    app: "App",
    notice: "bool" = False,
    long_lived: "bool" = False,
    environ: "Mapping[str, str] | None" = None,
    now: "float | None" = None,
) -> "bool":
    # Record one event; see :func:`spool_reporter.record`. Raises on failure (the caller swallows).
    env = os.environ if environ is None else environ
    if env.get(FLUSHER_ENV) or not is_event_name(event):
        return False
    user, policy = read_inputs(app, env)
    decision = decide(app, env, user, policy)
    if not decision.enabled:
        if decision.reason in ASK_REASONS:
            # Ask mode, not answered yet (rule 12). At a terminal, the question comes after the command's output
            # (_ask); with no terminal, and under the debug switch, nothing is asked and nothing recorded: an "off"
            # run plus one isatty().
            if not truthy(env.get(app.env_debug)) and os.isatty(0) and os.isatty(2):
                from ._ask import ask_later  # at a terminal, until answered

                ask_later(app, event, env, policy, long_lived)
            return False
        if decision.reason == "destination:none" and truthy(env.get(app.env_debug)):
            # DEP 8's debug switch still shows what would be recorded; with nowhere to send it, nothing is
            # written: the stored client id if there is one, else a random one that is not kept, and no notice.
            cid = None if user is None else user.get("client_id")
            when = time.time() if now is None else now
            _echo(app, build_line(app, event, cid if cid and is_uuid4(cid) else uuid4(), when))
            return True
        found = _has_queued(state_dir(app, env)) if decision.hard_off else 0
        if found & QUEUED:
            from ._local import purge_app  # rare: someone said no and events are queued

            purge_app(app, env, wait=LOCK_WAIT_SECONDS)
        if found & FORGET_PENDING and decision.reason == "user:disable":
            # Rare: the user's `disable` left a forget to send (only their own "no": an environment variable
            # or a policy never sends one). The spawn gate and the start are in _spawn.
            from ._spawn import start_forget_if_due

            start_forget_if_due(app, env)
        return False
    got = ensure_client_id(app, user, env, notice, decision.local)
    if got is None:
        return False
    client_id, show = got
    line = build_line(app, event, client_id, time.time() if now is None else now)
    if show:  # before the event is recorded
        from ._firstrun import notice_text

        after_local = not decision.local and seen_notice_mode(user) == NOTICE_LOCAL
        sys.stderr.write(notice_text(app, local=decision.local, after_local=after_local))
        sys.stderr.flush()
    if truthy(env.get(app.env_debug)):
        _echo(app, line)
        return True
    if decision.local:
        # Recorded under the local wording ("never sent"): kept in the local folder, which no flusher reads;
        # only `enable` moves them to the queue (_local.send_local), saying how many.
        folder = Folder(local_dir(app, env), create=True, own=LOCAL_OWN_LEVELS)
    else:
        folder = Folder(state_dir(app, env), create=True)
    with folder:
        size = append(
            folder,
            line,
            max_events=int_setting(user, "max_events", MAX_EVENTS),
            max_bytes=int_setting(user, "max_bytes", MAX_BYTES),
        )
        if not decision.local:  # local mode: recorded, never sent, no flusher
            start_flusher_if_due(app, folder, size, env=env, user=user, policy=policy, long_lived=long_lived)
    return True


def _echo(app: "App", line: "bytes") -> "None":
    sys.stderr.write(f"[{app.env_debug}] {line.decode('ascii')}")
    sys.stderr.flush()


# === the spawn gate: whether a flusher may start now ================================================================

# A flusher starts (docs/flusher.md) when (1) a destination is named and not plainly refused, this is not a
# flusher (no recursion) nor a frozen executable, (2) the back-off on disk has expired, (3) SPAWN_INTERVAL passed
# since the last spawn, unless the active spool is larger than SPAWN_THRESHOLD_BYTES or the caller is long-lived
# (runserver), and (4) no flusher is running. The hook decides it with three stats and a try-lock
# (start_flusher_if_due); _spawn does the spawning.

#: Held by the running flusher for its whole life (one at a time); like spool.lock, never deleted.
FLUSHER_LOCK_NAME: "Final" = "flusher.lock"
#: The descriptor number of flusher.lock, already locked, handed to a flusher the hook starts.
FLUSHER_LOCK_FD_ENV: "Final" = "SPOOL_REPORTER_FLUSHER_LOCK_FD"
#: Its mtime is the earliest time the next background flusher may start: the back-off, on disk.
GATE_NAME: "Final" = "flush.notbefore"
#: Its mtime is when the hook last started a flusher.
STAMP_NAME: "Final" = "flush.spawned"
#: A flusher costs ~100 ms of CPU that competes with the user's next command on a 2-core laptop (DESIGN
#: constraint 5), and events are not urgent: at most one spawn per 5 minutes from short commands.
SPAWN_INTERVAL: "Final" = 300.0
#: Shortens SPAWN_INTERVAL (tests); never lengthens it.
SPAWN_INTERVAL_ENV: "Final" = "SPOOL_REPORTER_SPAWN_INTERVAL"
#: An active spool this large (~150 events) starts a flusher regardless of the interval.
SPAWN_THRESHOLD_BYTES: "Final" = 64 * 1024
#: No second spawn this soon after one (but from a long-lived command on POSIX): covers a new flusher's start-up.
SPAWN_GAP: "Final" = 10.0
#: The longest back-off a flusher writes (_settings.BACKOFF_CAP, which also clamps Retry-After). A gate further
#: ahead was written by a clock that was wrong (or planted): it counts as expired, not as a year of silence.
MAX_BACKOFF: "Final" = 24 * 3600.0


def backing_off(gate: "float | None", now: "float") -> "bool":
    # Whether the back-off time ``gate`` (flush.notbefore's mtime) is still ahead, clamped to MAX_BACKOFF.
    return gate is not None and now < gate <= now + MAX_BACKOFF


#: The forget a ``disable`` left to a detached run (spool_reporter/_withdraw.py); its mtime is the next try's time.
FORGET_PENDING_NAME: "Final" = "forget.pending"
#: What _has_queued finds: events queued (or the local folder), a pending forget.
QUEUED: "Final" = 1
FORGET_PENDING: "Final" = 2


def _has_queued(path: "str") -> "int":
    # "Disabling also deletes everything queued": one scandir (or a failed open) when nothing is queued,
    # before paying for the cold module that deletes. The local folder counts as queued when it exists (the
    # purge removes it). The same scandir sees a pending forget (FORGET_PENDING): no extra system call.
    found = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if name.endswith(SEGMENT_SUFFIX) or name == LOCAL_FOLDER:
                    found |= QUEUED
                elif name == FORGET_PENDING_NAME:
                    found |= FORGET_PENDING
    except OSError:
        return 0
    return found


def effective_endpoint(
    app: "App", env: "Mapping[str, str]", user: "dict[str, str] | None", policy: "dict[str, str] | None"
) -> "str":
    # The destination in effect, exactly as named: the one named_endpoint finds, else the App's default; "" when
    # none (_settings validates it; status says what is wrong with it). What retired= records and decide compares.
    return named_endpoint(app, env, user, policy) or app.endpoint or ""


def named_endpoint(
    app: "App", env: "Mapping[str, str]", user: "dict[str, str] | None", policy: "dict[str, str] | None"
) -> "str":
    # The endpoint the environment, the user file or the policy names (each beats the App's default), or "".
    named = env.get(app.env_endpoint, "").strip()
    if not named:
        for values in (user, policy):
            named = "" if values is None else values.get("endpoint", "").strip()
            if named:
                break
    return named


def refused_endpoint(url: "str | None") -> "bool":
    # Plain http:// to a host by name that is not localhost: _settings refuses it (https://, or plain http only to
    # loopback), so no flusher is started just to find that out; the events stay queued and status says why. Any
    # less clear-cut URL (an IP address, IPv6) is left to the flusher's full check. Tested against _settings.
    if url is None or not url.startswith("http://"):
        return False
    host = url[7:].partition("/")[0].partition("?")[0].rpartition("@")[2].partition(":")[0].lower()
    return host[:1].isalpha() and host != "localhost" and not host.endswith(".localhost")


def shortened(env: "Mapping[str, str]", name: "str", longest: "float") -> "float":
    # A test's variable (SPAWN_INTERVAL_ENV, _ask's) shortens a bound, never lengthens it; malformed is ignored.
    raw = env.get(name)
    if raw:
        try:
            return min(longest, max(0.0, float(raw)))
        except ValueError:
            pass
    return longest


def mtime(folder: "Folder", name: "str") -> "float | None":
    # A regular file's mtime; anything else planted at the name means "no time" (the flusher replaces it).
    try:
        st = folder.lstat(name)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def claim_flusher_lock(folder: "Folder") -> "int | None":
    # Take flusher.lock (flock, like filelock) and return the descriptor, or None if a flusher holds it. A
    # child that inherits the descriptor holds the same lock (flock belongs to the open file description)
    # from its first instruction: the hook hands it over, so there is no start-up window for a second one.
    fd = open_ours(folder, FLUSHER_LOCK_NAME, LOCK_FLAGS)[0]
    if try_lock(fd):
        return fd
    os.close(fd)
    return None


def gate_open(
    folder: "Folder", active_size: "int", *, long_lived: "bool", env: "Mapping[str, str]", now: "float"
) -> "bool":
    # Steps 2-3 above: back-off expired, interval passed (or not needed).
    if backing_off(mtime(folder, GATE_NAME), now):
        return False
    if long_lived and not _WINDOWS:
        # No SPAWN_GAP for a long-lived command (runserver): it may run for hours, and an event it records just
        # after a spawn would wait for some later command. The lock hand-over (POSIX) keeps a second flusher out
        # while a new one starts up: a free flusher.lock means the last flusher has ended.
        return True
    stamp = mtime(folder, STAMP_NAME)
    # A stamp in the future (the clock was set back) counts as expired rather than blocking for long.
    if stamp is not None and stamp <= now + 60:
        interval = shortened(env, SPAWN_INTERVAL_ENV, SPAWN_INTERVAL)
        # A large spool (and on Windows, without the hand-over, a long-lived command) waits SPAWN_GAP after a
        # spawn: cheap insurance on top of the lock hand-over (the fault suite's storm once started 20 flushers
        # for 7 sends).
        if now - min(SPAWN_GAP, interval) < stamp:
            return False
        if not long_lived and active_size < SPAWN_THRESHOLD_BYTES and now - interval < stamp:
            return False
    return True


def start_flusher_if_due(
    app: "App",
    folder: "Folder",
    active_size: "int",
    *,
    env: "Mapping[str, str]",
    user: "dict[str, str] | None",
    policy: "dict[str, str] | None",
    long_lived: "bool",
) -> "bool":
    # Steps 1-4 above, then the start: whether a flusher was started. Raises like the rest of the hook.
    if env.get(FLUSHER_ENV) or getattr(sys, "frozen", False) or not sys.executable:
        return False  # no recursion; `python -m` cannot relaunch a frozen executable
    named = named_endpoint(app, env, user, policy)
    if not (named or app.endpoint) or refused_endpoint(named or app.endpoint):
        return False
    now = time.time()
    if not gate_open(folder, active_size, long_lived=long_lived, env=env, now=now):
        return False
    lock = claim_flusher_lock(folder)
    if lock is None:  # a flusher is running
        return False
    try:
        # Only now pay for importing the spawn logic; the child inherits the lock, so no second flusher can start
        # while this one is still starting up. An App's own default reaches the flusher, which knows the App only
        # by its names.
        from . import _spawn

        default = None if named else app.endpoint
        return _spawn.start(app, folder, env, now, lock_fd=lock, default_endpoint=default, long_lived=long_lived)
    finally:
        os.close(lock)
