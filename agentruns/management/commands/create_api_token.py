from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agentruns.tokens import create_token


class Command(BaseCommand):
    help = (
        "Create a bearer token for the JSON API and the socket; prints it alone on the last line."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(username=options["username"])
        except User.DoesNotExist:
            raise CommandError(f"no user {options['username']!r}") from None
        token = create_token(user)
        self.stderr.write(f"API token for {user.username} (shown once, stored hashed):")
        self.stdout.write(token)
