"""Consent: one pure decision, with the rule that made it.

The order, first match wins (docs/consent.md explains each rule):

1. ``<P>_NO_ANALYTICS`` set (not empty, not ``0``)            -> off  ``env:<P>_NO_ANALYTICS``
2. ``DO_NOT_TRACK`` set (not empty, not ``0``)                 -> off  ``env:DO_NOT_TRACK``
3. the system policy cannot be trusted                          -> off  ``policy:unreadable``
4. the system policy says ``disable=1``                         -> off  ``policy:disable``
5. the user file cannot be trusted                              -> off  ``user:unreadable``
6. the user file says ``disable=1``                             -> off  ``user:disable``
7. the user file says ``disable=0`` (``enable`` writes it)      -> on   ``user:enable``
8. a CI environment                                             -> off  ``ci:<VAR>``
9. the system policy says ``default=off`` (opt-in mode)         -> off  ``policy:opt-in``
10. otherwise (DEP 8's opt-out)                                 -> on   ``default``

Stdlib only: this module is on the hook path.
"""

from __future__ import annotations

import os

from . import _config, _paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from ._app import App

CI_VARIABLES: Final = (
    # The generic marker most CI services set, then vendor-specific ones for those that do not.
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
"""Environment variables whose presence marks a CI run (``CI=false``/``0`` does not count)."""

HARD_OFF_REASONS: Final = frozenset({"policy:disable", "user:disable"})
"""Reasons that mean the user or the system said no: queued events are deleted, not kept."""

MODE_OPT_OUT: Final = "opt-out"
MODE_OPT_IN: Final = "opt-in"


class Decision:
    """The outcome of :func:`decide`: ``enabled``, the ``reason`` (rule) and the ``mode``."""

    __slots__ = ("enabled", "mode", "reason")

    enabled: bool
    reason: str
    mode: str

    def __init__(self, *, enabled: bool, reason: str, mode: str) -> None:
        object.__setattr__(self, "enabled", enabled)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "mode", mode)

    def __setattr__(self, key: str, value: object) -> None:
        msg = "Decision is immutable"
        raise AttributeError(msg)

    def __repr__(self) -> str:
        return f"Decision(enabled={self.enabled!r}, reason={self.reason!r}, mode={self.mode!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.enabled, self.reason, self.mode) == (other.enabled, other.reason, other.mode)

    def __hash__(self) -> int:
        return hash((self.enabled, self.reason, self.mode))

    @property
    def hard_off(self) -> bool:
        """Off because someone said no (env, user file, policy): queued events must be deleted."""
        return not self.enabled and (self.reason.startswith("env:") or self.reason in HARD_OFF_REASONS)


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip() not in ("", "0")


def _ci_variable(environ: Mapping[str, str]) -> str | None:
    for name in CI_VARIABLES:
        value = environ.get(name)
        if value is not None and value.strip().lower() not in ("", "0", "false", "no"):
            return name
    return None


def decide(
    app: App,
    environ: Mapping[str, str],
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
) -> Decision:
    """Decide from already-read inputs. Pure: no I/O. ``None`` means "no such file"."""
    policy_opt_in = policy is not None and policy.get("default", "").lower() in ("off", "0", "opt-in", "no")
    mode = MODE_OPT_IN if policy_opt_in else MODE_OPT_OUT

    def off(reason: str) -> Decision:
        return Decision(enabled=False, reason=reason, mode=mode)

    if _truthy(environ.get(app.env_disable)):
        return off("env:" + app.env_disable)
    if _truthy(environ.get("DO_NOT_TRACK")):
        return off("env:DO_NOT_TRACK")
    if _config.is_broken(policy):
        return off("policy:unreadable")
    if policy is not None and policy.get("disable", "0").strip() != "0":
        return off("policy:disable")
    if _config.is_broken(user):
        return off("user:unreadable")
    user_disable = None if user is None else user.get("disable")
    if user_disable is not None and user_disable.strip() not in ("", "0"):
        return off("user:disable")
    if user_disable is not None and user_disable.strip() == "0":
        return Decision(enabled=True, reason="user:enable", mode=mode)
    ci = _ci_variable(environ)
    if ci is not None:
        return off("ci:" + ci)
    if policy_opt_in:
        return off("policy:opt-in")
    return Decision(enabled=True, reason="default", mode=mode)


def user_config_path(app: App, environ: Mapping[str, str] | None = None) -> str:
    """The user's config file (DEP 8: ``~/.config/djangoanalytics``)."""
    return os.path.join(_paths.user_config_dir(environ), app.config_name)


def policy_path(app: App, environ: Mapping[str, str] | None = None) -> str:
    """The system policy file a distributor ships (Linux: ``/etc/xdg/djangoanalytics``)."""
    return os.path.join(_paths.site_config_dir(environ), app.config_name)


def read_inputs(
    app: App, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """Read the user file and the policy file (each ``None``, a mapping, or ``BROKEN``)."""
    return _config.read(user_config_path(app, environ)), _config.read(policy_path(app, environ))


def current(app: App, environ: Mapping[str, str] | None = None) -> Decision:
    """Read the files and decide, for this process's environment unless ``environ`` is given."""
    env = os.environ if environ is None else environ
    user, policy = read_inputs(app, env)
    return decide(app, env, user, policy)


REASON_TEXT: Final = {
    "env": "the environment variable {detail} is set",
    "policy:unreadable": "the system policy file cannot be read safely",
    "policy:disable": "the system policy turns reporting off",
    "user:unreadable": "your config file cannot be read safely",
    "user:disable": "you turned it off (disable=1 in your config file)",
    "user:enable": "you turned it on (disable=0 in your config file)",
    "ci": "this looks like a CI run ({detail} is set); 'enable' overrides",
    "policy:opt-in": "the system policy makes reporting opt-in; run 'enable' to opt in",
    "default": "on by default (opt-out), as DEP 8 proposes",
}
"""Human wording of each reason, for ``status``."""


def explain(reason: str) -> str:
    """A sentence for a reason code."""
    if reason in REASON_TEXT:
        return REASON_TEXT[reason]
    kind, _, detail = reason.partition(":")
    return REASON_TEXT.get(kind, reason).format(detail=detail)
