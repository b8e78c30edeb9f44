"""Idempotent demo data: orders ORD-1001..ORD-1050, open tickets, the staff users and their
groups (DESIGN.md 6), and the trainees' tool policy (no `issue_refund`)."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand
from django.db import transaction

from agentruns.models import ToolPolicy, ToolRule
from support.models import Order, Ticket

FIRST = ["Ada", "Ben", "Chloe", "Dev", "Elena", "Farah", "Gus", "Hana", "Ivan", "Jun"]
LAST = ["Lovelace", "Okafor", "Martin", "Patel", "Rossi", "Haddad", "Berg", "Sato", "Petrov", "Kim"]
ITEMS = [
    "blender",
    "desk lamp",
    "rain jacket",
    "headphones",
    "coffee grinder",
    "backpack",
    "running shoes",
    "kettle",
    "monitor stand",
    "yoga mat",
]
COMPLAINTS = [
    "arrived broken",
    "never arrived",
    "is not what I ordered",
    "stopped working after a week",
    "was charged twice",
]

# everyone looks at runs, the inbox and the support desk's tickets
LOOK = ["agentruns.view_run", "approvals.view_approval", "support.view_ticket"]
# group -> permissions
# who may start runs may also log a customer's request from another channel (`POST
# /api/tickets`, support.add_ticket): a phone call, a mail forwarded by hand
ROLES = {
    "viewer": LOOK,  # may only look
    "approver": [*LOOK, "agentruns.start_run", "approvals.decide_approval", "support.add_ticket"],
    # may look, start runs and log requests, never refund
    "trainees": [*LOOK, "agentruns.start_run", "support.add_ticket"],
}
# user -> group (lead: a superuser, in no group)
USERS = {
    "lead": None,
    "approver": "approver",
    "approver2": "approver",
    "viewer": "viewer",
    "trainee": "trainees",
}
# the trainees' runs may look up orders, write notes, reply and hand a request over to a
# colleague (an item in the inbox), but never refund
TRAINEE_TOOLS = {
    "lookup_order": True,
    "add_ticket_note": True,
    "send_customer_reply": True,
    "hand_over": True,
    "issue_refund": False,
}


def demo_password(user) -> str:
    """A random password that passes every configured validator (AUTH_PASSWORD_VALIDATORS)."""
    while True:
        password = secrets.token_urlsafe(12)
        try:
            validate_password(password, user)
        except ValidationError:
            continue  # e.g. all digits by chance: draw again
        return password


def amount_for(n: int) -> int:
    """Deterministic amounts spread over 20.00 .. 400.00."""
    return 2000 + (n * 7919) % 38001


class Command(BaseCommand):
    help = (
        "Create demo orders, tickets, the users lead, approver, approver2, viewer and trainee, "
        "their groups and the trainees' tool policy (idempotent)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--orders", type=int, default=50)
        parser.add_argument(
            "--reset-passwords",
            action="store_true",
            help="Give the demo users new passwords (printed).",
        )

    @transaction.atomic
    def handle(self, *args, **options) -> None:
        created_orders = 0
        for i in range(options["orders"]):
            n = 1001 + i
            first, last = FIRST[i % 10], LAST[(i * 3) % 10]
            order, created = Order.objects.get_or_create(
                order_id=f"ORD-{n}",
                defaults={
                    "customer_name": f"{first} {last}",
                    "customer_email": f"{first.lower()}.{last.lower()}@example.com",
                    "amount_cents": amount_for(n),
                    "currency": "USD",
                    "item": ITEMS[i % len(ITEMS)],
                },
            )
            created_orders += created
            Ticket.objects.get_or_create(
                ticket_id=f"T-{n}",
                defaults={
                    "order": order,
                    "subject": f"Order {order.order_id}: {order.item} {COMPLAINTS[i % len(COMPLAINTS)]}",
                    "body": f"Hello, my {order.item} {COMPLAINTS[i % len(COMPLAINTS)]}. Please refund.",
                },
            )
        self.stdout.write(
            f"orders: {Order.objects.count()} ({created_orders} new), open tickets: {Ticket.objects.filter(status='open').count()}"
        )

        for role, perms in ROLES.items():
            group, _ = Group.objects.get_or_create(name=role)
            group.permissions.set([self._perm(p) for p in perms])
        self._trainee_policy()

        User = get_user_model()
        for username, group in USERS.items():
            user, created = User.objects.get_or_create(
                username=username, defaults={"email": f"{username}@example.com"}
            )
            if group is None:
                user.is_staff = user.is_superuser = True
            else:
                user.groups.set([Group.objects.get(name=group)])
            if created or options["reset_passwords"]:
                password = demo_password(user)
                user.set_password(password)
                self.stdout.write(f"user {username} password {password}")
            else:
                self.stdout.write(
                    f"user {username} exists (password unchanged; --reset-passwords prints new ones)"
                )
            user.save()

    @staticmethod
    def _trainee_policy() -> None:
        """Created once; an admin's later edits of it are kept (it is configuration): a tool
        the seed knows and the policy has no rule for (one a newer release added, like
        `hand_over`) gets its rule, and no existing rule is changed."""
        policy, _ = ToolPolicy.objects.get_or_create(
            group=Group.objects.get(name="trainees"),
            defaults={"note": "trainees may look orders up and reply, never refund"},
        )
        ruled = set(policy.rules.values_list("tool", flat=True))
        ToolRule.objects.bulk_create(
            ToolRule(policy=policy, tool=tool, allowed=allowed)
            for tool, allowed in TRAINEE_TOOLS.items()
            if tool not in ruled
        )

    @staticmethod
    def _perm(dotted: str) -> Permission:
        app_label, codename = dotted.split(".")
        return Permission.objects.get(content_type__app_label=app_label, codename=codename)
