"""A typed setting and the `Conf` that reads a tuple of them, once (DESIGN.md 7).

`Setting.read` takes the value from Django's settings when a settings module (or a test) defines
it, else from the environment, else its default, and a value that cannot be parsed raises
`ImproperlyConfigured` naming the variable. A `Conf` parses each value once per process (again
after a test changes a setting); a misspelt attribute is an `AttributeError`, and an `AGENTRUNS_*`
environment variable no `Conf` declares fails the start-up check (`check_environment`). The
`env_*` parsers are the ones `config/settings.py` uses for Django's own settings. The runtime's
declarations are in `agentruns/conf.py`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# importing django.conf is safe from config/settings.py: only attribute access loads settings
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

PREFIX = "AGENTRUNS_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


# ------------------------------------------------------------------ parsers
def parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)"
    )


def parse_int(name: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer")
    if isinstance(raw, int):
        return raw
    try:
        return int(str(raw).strip().replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def parse_float(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number")
    try:
        value = float(raw if isinstance(raw, int | float) else str(raw).strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    return value


def parse_str(name: str, raw: Any) -> str:
    return str(raw)


_PARSERS: dict[type, Callable[[str, Any], Any]] = {
    bool: parse_bool,
    int: parse_int,
    float: parse_float,
    str: parse_str,
}


def _env(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw == "" else raw


def env_str(name: str, default: str = "") -> str:
    raw = _env(name)
    return default if raw is None else raw


def env_bool(name: str, default: bool = False) -> bool:
    raw = _env(name)
    return default if raw is None else parse_bool(name, raw)


def env_int(name: str, default: int) -> int:
    raw = _env(name)
    return default if raw is None else parse_int(name, raw)


def env_float(name: str, default: float) -> float:
    raw = _env(name)
    return default if raw is None else parse_float(name, raw)


# ------------------------------------------------------------------ a setting, and the Conf of many
@dataclass(frozen=True)
class Setting:
    name: str  # the variable: a Django setting or an environment variable
    type: type
    default: Any  # a value, or a callable of no arguments (read when first needed)
    doc: str
    minimum: float | None = None
    # a parser of its own for a structured value (a JSON object): (name, raw) -> value, raising
    # ImproperlyConfigured; None: the parser of `type`
    parser: Callable[[str, Any], Any] | None = None
    maximum: float | None = None

    def read(self) -> Any:
        raw = getattr(settings, self.name, None)
        if raw is None:
            raw = _env(self.name)
        if raw is None:
            raw = self.default() if callable(self.default) else self.default
        value = (self.parser or _PARSERS[self.type])(self.name, raw)
        if self.minimum is not None and value < self.minimum:
            raise ImproperlyConfigured(f"{self.name}={raw!r} is below its minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ImproperlyConfigured(f"{self.name}={raw!r} is above its maximum {self.maximum}")
        return value


_ALL: list[Conf] = []


class Conf:
    """Attribute access by the name without its prefix: `conf.LEASE_TTL_SECONDS`."""

    def __init__(self, settings: tuple[Setting, ...], prefix: str = PREFIX) -> None:
        self._by_attr = {s.name.removeprefix(prefix): s for s in settings}
        self._values: dict[str, Any] = {}
        _ALL.append(self)

    def __getattr__(self, attr: str) -> Any:
        try:
            setting = self._by_attr[attr]
        except KeyError:
            raise AttributeError(
                f"no setting {attr!r} (known: {', '.join(sorted(self._by_attr))})"
            ) from None
        values = self.__dict__["_values"]
        if attr not in values:
            values[attr] = setting.read()
        return values[attr]

    def reload(self, **_: Any) -> None:
        self._values.clear()

    def load_all(self) -> None:
        """Parse every setting now, so a bad value stops the process at start-up."""
        for attr in self._by_attr:
            getattr(self, attr)

    def names(self) -> set[str]:
        return {s.name for s in self._by_attr.values()}


def all_settings() -> list[Setting]:
    """Every setting of every Conf (the runtime's and the apps'), for docs and checks."""
    return [setting for each in _ALL for setting in each._by_attr.values()]


def check_environment() -> None:
    """Every `AGENTRUNS_*` variable in the environment must be one somebody reads."""
    known = set().union(*(c.names() for c in _ALL))
    unknown = sorted(k for k in os.environ if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise ImproperlyConfigured(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(k for k in known if k.startswith(PREFIX)))}"
        )


def _reload_on_change(*, setting: str, **_: Any) -> None:
    # tests change settings at run time (pytest-django's `settings` fixture): re-read everything
    for each in _ALL:
        each.reload()


def connect_reload() -> None:
    setting_changed.connect(_reload_on_change, dispatch_uid="agentruns.conf.reload")
