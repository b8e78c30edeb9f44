from django.core.management.base import BaseCommand

from agentruns.models import ApiToken
from agentruns.selectors.people import username_lookup


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "-"


class Command(BaseCommand):
    help = "List API tokens (never the tokens themselves): id, prefix, user, state, dates."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", nargs="?", help="only this user's tokens")
        parser.add_argument("--all", action="store_true", help="include revoked and expired ones")

    def handle(self, *args, **options) -> None:
        rows = ApiToken.objects.select_related("user").order_by("-created_at")
        if options["username"]:
            rows = rows.filter(**{username_lookup("user"): options["username"]})
        self.stdout.write(
            f"{'id':>5}  {'prefix':<12} {'user':<16} {'state':<8} {'created':<16} "
            f"{'expires':<16} last used"
        )
        for row in rows:
            if row.state != "active" and not options["all"]:
                continue
            self.stdout.write(
                f"{row.pk:>5}  {row.prefix + '…':<12} {row.user.get_username():<16} "
                f"{row.state:<8} {_when(row.created_at):<16} {_when(row.expires_at):<16} "
                f"{_when(row.last_used_at)}"
            )
