"""Bearer tokens for the API and the socket. Only a SHA-256 of each token is stored."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.utils import timezone

from agentruns.models import ApiToken

PREFIX = "art_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_token(user: Any) -> str:
    raw = PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, token_hash=hash_token(raw), prefix=raw[:10])
    return raw


def user_for_token(raw: str) -> Any | None:
    if not raw:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(raw.strip()), revoked=False)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def bearer_from_header(value: str | None) -> str:
    if not value:
        return ""
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""
