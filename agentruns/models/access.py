"""Who may do what: API tokens and the groups' tool policies (DESIGN.md 3)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, models
from django.db.models import Q
from django.utils import timezone


class ApiToken(models.Model):
    """A bearer token for the JSON API and the socket. Only the SHA-256 is stored.

    Valid while not revoked, not past `expires_at` and its user is active (`is_valid`)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    # set by `tokens.create_token` (AGENTRUNS_API_TOKEN_DAYS, default 90); NULL: never expires
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def state(self) -> str:
        if self.revoked:
            return "revoked"
        return "expired" if self.is_expired else "active"

    @classmethod
    def valid(cls) -> models.QuerySet:
        """Tokens that may authenticate right now (`authenticating` is the same rule)."""
        return cls.objects.filter(revoked=False, user__is_active=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )

    @classmethod
    def authenticating(cls, token_hash: str) -> Authenticated | None:
        """The valid token of `token_hash` with its user and the access generation, in one
        statement whose SQL is built once per process: every API request and socket runs it, and
        building it through the ORM cost ten times the statement (2.8 ms against 0.24 ms of CPU)."""
        sql, user_fields, converters = _authenticating_sql(connection.vendor)
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(sql, [token_hash, now])
            row = cursor.fetchone()
        if row is None:
            return None
        values = list(row)
        for index, column, functions in converters:
            for convert in functions:
                values[index] = convert(values[index], column, connection)
        user_model = user_fields[0].model
        user = user_model.from_db(connection.alias, [f.attname for f in user_fields], values[3:])
        return Authenticated(values[0], values[1], values[2], user)


@dataclass(frozen=True)
class Authenticated:
    token_id: int
    last_used_at: datetime | None
    access_generation: int | None
    user: Any


@cache
def _authenticating_sql(vendor: str) -> tuple[str, list, list]:
    """`ApiToken.valid()` filtered on the hash as SQL (names from the models): the token's id and
    last use, the access generation, the user's columns; and the converters the ORM applies to
    those columns (SQLite returns datetimes and booleans as text and integers)."""
    qn = connection.ops.quote_name
    user_model = ApiToken._meta.get_field("user").related_model
    user_fields = list(user_model._meta.concrete_fields)
    token_fields = [ApiToken._meta.get_field("id"), ApiToken._meta.get_field("last_used_at")]
    token, user = qn(ApiToken._meta.db_table), qn(user_model._meta.db_table)
    generation = qn(AccessGeneration._meta.db_table)
    sql = (
        f"SELECT t.id, t.last_used_at, (SELECT g.value FROM {generation} g WHERE g.id = 1), "
        + ", ".join(f"u.{qn(f.column)}" for f in user_fields)
        + f" FROM {token} t JOIN {user} u ON u.{qn(user_model._meta.pk.column)} = t.user_id "
        "WHERE t.token_hash = %s AND NOT t.revoked AND u.is_active "
        "AND (t.expires_at IS NULL OR t.expires_at > %s)"
    )
    converters = []
    columns = [(0, "t", token_fields[0]), (1, "t", token_fields[1])]
    columns += [(3 + i, "u", f) for i, f in enumerate(user_fields)]
    for index, alias, field in columns:
        column = field.get_col(alias)
        functions = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
        if functions:
            converters.append((index, column, functions))
    return sql, user_fields, converters


class ApprovalOverride(models.TextChoices):
    TOOL = "tool", "as the tool says"
    ALWAYS = "always", "always"


class ToolPolicy(models.Model):
    """Which tools a group's members' runs may use (DESIGN.md 3), edited in the admin.

    A user's effective policy combines the policies of all their groups: a tool is allowed when
    any of them allows it, an approval override or a limit applies when any of them sets one.
    A user in no group with a policy gets the agent's tools unchanged. Runs freeze the result
    when they start (`Run.permissions`): an edit here applies to runs started afterwards.
    """

    group = models.OneToOneField("auth.Group", on_delete=models.CASCADE, related_name="tool_policy")
    other_tools_allowed = models.BooleanField(
        default=False,
        help_text="Tools without a rule below: allowed (a blacklist) or not (a whitelist).",
    )
    note = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "tool policies"

    def __str__(self) -> str:
        return f"tool policy of {self.group}"


class ToolRule(models.Model):
    """One tool in a group's policy: may the group's runs call it, how it is approved, and the
    most an approver of this group may approve (in the tool's `amount_arg` unit)."""

    policy = models.ForeignKey(ToolPolicy, on_delete=models.CASCADE, related_name="rules")
    tool = models.CharField(max_length=100)
    allowed = models.BooleanField(default=True)
    approval = models.CharField(
        max_length=8,
        choices=ApprovalOverride.choices,
        default=ApprovalOverride.TOOL,
        help_text="Policies only add approval requirements: 'always' parks every call.",
    )
    approver_limit = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The most this group's approvers may approve (the tool's amount, e.g. cents); "
        "empty: AGENTRUNS_APPROVER_LIMIT_CENTS.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["policy", "tool"], name="toolrule_unique_policy_tool")
        ]

    def __str__(self) -> str:
        return f"{self.tool}: {'allowed' if self.allowed else 'not allowed'}"


class AccessGeneration(models.Model):
    """One row (id 1) whose `value` changes, to a fresh random number, on every write to what
    decides a user's permissions: group membership, user and group permissions, groups,
    permissions, content types, tool policies and their rules.

    Database triggers change it (migration 0011), so a queryset `update()`, the admin, a raw SQL
    statement or another process all invalidate what `runtime/access/cache.py` keeps per
    process. Random rather than counting: a rolled-back change restores the value it had, and a
    value is never reused for another state."""

    id = models.PositiveSmallIntegerField(primary_key=True)
    value = models.BigIntegerField()

    def __str__(self) -> str:
        return f"access generation {self.value}"
