"""Bearer tokens for the API and the socket. Only a SHA-256 of each token is stored.

A token expires `AGENTRUNS_API_TOKEN_DAYS` (default 90) after it is made; a revoked or expired
token is refused on its next request, and an open socket or chat stream it authenticated ends
within 2 s (stream/access/viewers.py re-checks them, one query per kind and process).
Authenticating is one query, which also reads the access generation: the user's permissions,
groups and policies then come from `runtime/access/cache.py` until any of them changes.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agentruns.conf import API_TOKEN_MAX_DAYS, conf
from agentruns.models import ApiToken
from agentruns.runtime.access import cache

PREFIX = "art_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()


def create_token(user: Any, days: float | None = None) -> str:
    """A new token for `user`, valid for `days` (default AGENTRUNS_API_TOKEN_DAYS; 0: forever)."""
    raw, _ = issue_token(user, days)
    return raw


def check_days(days: float) -> float:
    """A token's lifetime in days: 0 (never expires) up to API_TOKEN_MAX_DAYS; ValueError for
    anything else (NaN, infinity, a negative number or one past any date a token can hold)."""
    if not math.isfinite(days) or days < 0 or days > API_TOKEN_MAX_DAYS:
        raise ValueError(
            f"days must be a number from 0 (never expires) to {API_TOKEN_MAX_DAYS}, not {days:g}"
        )
    return days


def issue_token(user: Any, days: float | None = None) -> tuple[str, ApiToken]:
    days = conf.API_TOKEN_DAYS if days is None else check_days(days)
    raw = PREFIX + secrets.token_urlsafe(32)
    expires = timezone.now() + timedelta(days=days) if days else None
    row = ApiToken.objects.create(
        user=user, token_hash=hash_token(raw), prefix=raw[:10], expires_at=expires
    )
    return raw, row


def user_for_token(raw: str) -> Any | None:
    """The token's user, or None when it is unknown, revoked, expired or its user inactive."""
    if not raw:
        return None
    # one statement: the token, its user and the access generation its permissions are kept under
    token = ApiToken.authenticating(hash_token(raw.strip()))
    if token is None:
        return None
    cache.stamp(token.user, token.access_generation)
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.token_id).update(last_used_at=now)
    return token.user


def revoke(tokens: QuerySet[ApiToken]) -> int:
    """Revoke every still-unrevoked token of `tokens`; returns how many."""
    return tokens.filter(revoked=False).update(revoked=True, revoked_at=timezone.now())


def bearer_from_header(value: str | None) -> str:
    if not value:
        return ""
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""
