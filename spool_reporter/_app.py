"""The description of a reporting application: who is counted, and where its files and switches are."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

STATE_APPNAME: Final = "spool_reporter"
"""The platformdirs application name of our state folder; each :class:`App` gets a subfolder of it."""

_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_VERSION_CHARS: Final = frozenset("0123456789.")
_PREFIX_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
MAX_NAME: Final = 40
"""GA4 caps names at 40 characters; we use the same bound for application and event names."""


def _check(value: str, chars: frozenset[str], what: str, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or not set(value) <= chars:
        msg = f"{what} must be 1-{limit} characters from {''.join(sorted(chars))!r}, got {value!r}"
        raise ValueError(msg)
    return value


def coarse_version(version: str) -> str:
    """``'5.2.7'`` -> ``'5.2'``: the allowlist keeps versions at major.minor."""
    parts = version.split(".")
    digits = []
    for part in parts[:2]:
        num = ""
        for ch in part:
            if not ch.isdigit():
                break
            num += ch
        if not num:
            break
        digits.append(str(int(num)))
    return ".".join(digits) or "0"


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
    """

    __slots__ = ("cli_name", "config_name", "docs_url", "env_prefix", "name", "slug", "version")

    name: str
    version: str
    slug: str
    config_name: str
    env_prefix: str
    cli_name: str
    docs_url: str

    def __init__(
        self,
        *,
        name: str,
        version: str,
        slug: str | None = None,
        config_name: str | None = None,
        env_prefix: str | None = None,
        cli_name: str = "django-spool",
        docs_url: str = "https://spool-reporter.readthedocs.io/",
    ) -> None:
        set_ = object.__setattr__
        set_(self, "name", _check(name, _NAME_CHARS, "name"))
        set_(self, "version", coarse_version(str(version)))
        slug = _check(slug if slug is not None else name.lower(), _NAME_CHARS, "slug")
        set_(self, "slug", slug)
        set_(self, "config_name", _check(config_name or slug + "analytics", _NAME_CHARS, "config_name"))
        set_(
            self,
            "env_prefix",
            _check(env_prefix or slug.upper().replace("-", "_").replace(".", "_"), _PREFIX_CHARS, "env_prefix"),
        )
        set_(self, "cli_name", cli_name)
        set_(self, "docs_url", docs_url)

    def __setattr__(self, key: str, value: object) -> None:
        msg = "App is immutable"
        raise AttributeError(msg)

    def __repr__(self) -> str:
        return f"App(name={self.name!r}, version={self.version!r}, slug={self.slug!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, App):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    @property
    def env_disable(self) -> str:
        """The environment variable that turns reporting off (DEP 8: ``DJANGO_NO_ANALYTICS``)."""
        return self.env_prefix + "_NO_ANALYTICS"

    @property
    def env_debug(self) -> str:
        """Print the event on stderr instead of spooling it (DEP 8: ``DJANGO_ANALYTICS_DEBUG``)."""
        return self.env_prefix + "_ANALYTICS_DEBUG"

    @property
    def env_endpoint(self) -> str:
        """Override the configured endpoint."""
        return self.env_prefix + "_ANALYTICS_ENDPOINT"

    @property
    def env_transport(self) -> str:
        """Override the configured transport."""
        return self.env_prefix + "_ANALYTICS_TRANSPORT"


def django_app(version: str = "0") -> App:
    """The application DEP 8 is about: ``djangoanalytics``, ``DJANGO_NO_ANALYTICS``, ``DJANGO_ANALYTICS_DEBUG``.

    The version only matters for events; the command line passes the default.
    """
    return App(name="Django", version=version, slug="django", config_name="djangoanalytics", env_prefix="DJANGO")
