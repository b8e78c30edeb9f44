"""The admin of the runtime (autodiscovered as `agentruns.admin`): the read-only record and the
configuration staff edit."""

from agentruns.admin import configuration, records

__all__ = ["configuration", "records"]
