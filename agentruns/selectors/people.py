"""Who holds a permission, in words a page can show ("Only operators can retry this run: ask
someone in ops, or an administrator")."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

# a page names at most this many groups
GROUPS_SHOWN = 5


def username_lookup(relation: str) -> str:
    """`<relation>__<the user model's USERNAME_FIELD>`: a query on who did something by the name
    people sign in with, whatever the project's AUTH_USER_MODEL calls it."""
    return f"{relation}__{get_user_model().USERNAME_FIELD}"


def email_lookup() -> str:
    """The user model's email field (`EMAIL_FIELD`, "email" by default)."""
    return get_user_model().get_email_field_name()


def groups_with_permission(permission: str) -> list[str]:
    """The names of the groups granted `permission` ("app_label.codename"), one query."""
    app_label, _, codename = permission.partition(".")
    return list(
        Group.objects.filter(
            permissions__content_type__app_label=app_label, permissions__codename=codename
        )
        .order_by("name")
        .values_list("name", flat=True)[:GROUPS_SHOWN]
    )
