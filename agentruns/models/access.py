"""Who may do what: API tokens and the groups' tool policies (DESIGN.md 3)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
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
        """Tokens that may authenticate right now."""
        return cls.objects.filter(revoked=False, user__is_active=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )


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
