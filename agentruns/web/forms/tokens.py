"""A start form's one-time token: a double click, a resent form or a reload after the POST
starts one run, not two.

Every form that starts a run (the start form, the support desk's "run the agent" button)
carries a random token made when the page rendered; the POST passes `dedupe_key_of(token)` to
`services.start_run`, whose (agent, dedupe key) constraint makes a second POST of the same form
return the first run (`created` False). The key has its own namespace (`form:`), like the chats'
`chat:` keys, and a token that is not one of ours is refused rather than trusted.
"""

from __future__ import annotations

import re
import secrets

FIELD = "form_token"
_PREFIX = "form:"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{20,64}$")


class BadFormToken(ValueError):
    """The form's token is missing or not one this app made (an old page, a hand-made POST)."""


def new_form_token() -> str:
    return secrets.token_urlsafe(18)  # 24 characters, 144 random bits


def dedupe_key_of(token: str | None) -> str:
    """The dedupe key of a posted form token (BadFormToken if it is not a token of ours)."""
    if not token or not _TOKEN.match(token):
        raise BadFormToken("this form has expired: reload the page and send it again")
    return _PREFIX + token
