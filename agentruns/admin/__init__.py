"""The admin of the runtime (autodiscovered as `agentruns.admin`): the read-only record, the
operation keys across runs, and the configuration staff edit."""

from agentruns.admin import configuration, operations, records

__all__ = ["configuration", "operations", "records"]
