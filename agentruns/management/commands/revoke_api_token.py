from django.core.management.base import BaseCommand, CommandError

from agentruns.models import ApiToken
from agentruns.selectors.people import username_lookup
from agentruns.tokens import hash_token, revoke


class Command(BaseCommand):
    help = (
        "Revoke API tokens at once (requests and open sockets using them are refused): by id or "
        "prefix as `list_api_tokens` shows them, by the token itself, or every token of a user."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("token", nargs="?", help="an id, a prefix (art_…) or the whole token")
        parser.add_argument("--user", help="revoke every token of this user")

    def handle(self, *args, **options) -> None:
        given, username = options["token"], options["user"]
        if bool(given) == bool(username):
            raise CommandError("name one token (id, prefix or token) or --user <username>")
        if username:
            rows = ApiToken.objects.filter(**{username_lookup("user"): username})
        elif given.isdigit():
            rows = ApiToken.objects.filter(pk=int(given))
        else:
            rows = ApiToken.objects.filter(token_hash=hash_token(given)) | ApiToken.objects.filter(
                prefix=given.rstrip("…")[:12]
            )
        found = rows.count()
        if not found:
            raise CommandError("no such token")
        if found > 1 and not username:
            raise CommandError(f"{found} tokens match; give the id from `list_api_tokens`")
        self.stdout.write(f"revoked {revoke(rows)} of {found} token(s)")
