"""The desk's JSON API (DESIGN.md 6): `POST /api/tickets`, a customer's request from an outside
channel (a mail gateway, a web form, a phone call noted by staff).

It needs `support.add_ticket`: logging a request is the desk's own write, not starting a run, so
an intake integration's token may log tickets without being able to start agents or see runs
(the demo's approvers and trainees have it, as they take requests by phone; viewers do not).
Bounded like the other doors: the API's body limits and strict schema, and a token bucket per
sender (`support.desk.actions`); a repeated `Idempotency-Key` from the same sender answers 200 with
the ticket it made.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse

from agentruns.api.endpoint import endpoint
from agentruns.api.parsing import BadRequest, check_text
from agentruns.api.schemas import TIME, obj
from agentruns.runtime.values.timestamps import iso
from support.desk import actions
from support.models import Ticket

TICKET = obj(
    {
        "ticket_id": {"type": "string"},
        "order_id": {"type": "string"},
        "customer": {"type": "string"},
        "subject": {"type": "string"},
        "body": {"type": "string"},
        "status": {"type": "string"},
        "created_at": TIME,
        "created_by": {"type": ["string", "null"]},
        "url": {"type": "string"},
    }
)


def ticket_payload(ticket: Ticket) -> dict:
    order = ticket.order
    return {
        "ticket_id": ticket.ticket_id,
        "order_id": order.order_id,
        "customer": order.customer_name,
        "subject": ticket.subject,
        "body": ticket.body,
        "status": ticket.status,
        "created_at": iso(ticket.created_at),
        "created_by": ticket.created_by.get_username() if ticket.created_by_id else None,
        "url": reverse("ticket-detail", args=[ticket.ticket_id]),
    }


@endpoint(
    "POST",
    "/tickets",
    summary="Log a customer's request (a ticket) from an outside channel",
    permission=actions.ADD_TICKET,
    body={
        "order_id": {"type": "string", "minLength": 1, "maxLength": 20},
        "subject": {"type": "string", "minLength": 1, "maxLength": actions.SUBJECT_MAX},
        "body": {"type": "string", "maxLength": actions.BODY_MAX},
    },
    required=("order_id", "subject", "body"),
    headers={"Idempotency-Key": {"type": "string", "maxLength": actions.INTAKE_KEY_MAX}},
    responses={
        201: "the ticket (`ticket_id` in it)",
        200: "the ticket a repeated Idempotency-Key made",
        400: "a field missing, of the wrong type, too long, or with characters text may not hold",
        403: "no support.add_ticket",
        404: "no such order",
        429: "too many tickets from this sender (Retry-After)",
    },
    tags=("desk",),
    returns=TICKET,
    provides={"ticket_id": "/ticket_id"},
    example={
        "order_id": "ORD-1050",
        "subject": "The yoga mat smells",
        "body": "Hi, the yoga mat I got smells of chemicals. Can I get my money back?",
    },
)
def ticket_create(request: HttpRequest, body: dict) -> tuple[dict, int]:
    """A new ticket on the order, numbered after it (`T-1050-2`), in the queue at once; run the
    refund agent on it with `"ticket_id"` in its input."""
    for field in ("order_id", "subject", "body"):
        check_text(body[field], field)
    if not body["subject"].strip():
        raise BadRequest("'subject' must not be blank")
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > actions.INTAKE_KEY_MAX or (key and not key.isprintable()):
        raise BadRequest(
            f"Idempotency-Key must be at most {actions.INTAKE_KEY_MAX} printable characters"
        )
    try:
        logged = actions.do_log_ticket(
            order_id=body["order_id"].strip(),
            subject=body["subject"].strip(),
            body=body["body"],
            user=request.user,
            intake_key=key,
        )
    except LookupError as exc:
        raise BadRequest(str(exc).strip("'\""), 404) from None
    except actions.DeskRefused as exc:
        raise BadRequest(str(exc), 409) from None
    return ticket_payload(logged.ticket), 201 if logged.created else 200
