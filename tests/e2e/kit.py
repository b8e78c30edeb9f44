"""What the browser tests do alike: give a user a password the server can check, sign in."""

from __future__ import annotations

import re

from django.conf import global_settings

PASSWORD = "browser-pw"


def set_browser_password(user, settings) -> None:
    """Give `user` PASSWORD, hashed so the server process can check it: the suite hashes with
    MD5 for speed, the server only knows the real hashers."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    user.set_password(PASSWORD)
    user.save()


def logged_in_page(browser, base_url: str, username: str, init_script: str, next_path: str = ""):
    """A new page with `init_script` installed, signed in as `username` through the login form;
    it waits until the sign-in has landed (on `next_path` if given)."""
    page = browser.new_page()
    page.add_init_script(init_script)
    page.goto(f"{base_url}/accounts/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    if next_path:
        page.wait_for_url(re.compile(re.escape(next_path) + "$"), timeout=60_000)
    else:
        page.wait_for_url(lambda url: "/accounts/login" not in url, timeout=60_000)
    return page
