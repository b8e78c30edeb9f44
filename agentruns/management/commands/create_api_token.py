from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agentruns.conf import conf
from agentruns.tokens import check_days, issue_token


class Command(BaseCommand):
    help = (
        "Create a bearer token for the JSON API and the socket; prints it alone on the last line."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--days",
            type=float,
            default=None,
            help=f"valid for this many days (default {conf.API_TOKEN_DAYS:g}; 0: never expires)",
        )

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        try:
            user = User._default_manager.get_by_natural_key(options["username"])
        except User.DoesNotExist:
            raise CommandError(f"no user {options['username']!r}") from None
        days = options["days"]
        if days is not None:
            try:
                check_days(days)
            except ValueError as exc:
                raise CommandError(f"--{exc}") from None
        raw, row = issue_token(user, days)
        until = row.expires_at.strftime("%Y-%m-%d %H:%M UTC") if row.expires_at else "never"
        self.stderr.write(
            f"API token {row.prefix}… for {user.get_username()}, expires {until} "
            "(shown once, stored hashed; revoke with `manage.py revoke_api_token`):"
        )
        self.stdout.write(raw)
