"""The per-process access cache (runtime/access/cache.py): a POST /api/runs by a user in a group
with a tool policy is three statements (token + generation, quota bucket, the run with its
in-flight count; a keyed agent's line adds its two), and every write to what decides a permission, however it is made (the ORM, a queryset
update or delete that sends no signal, raw SQL), is seen by the very next request."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.models import ApiToken, Run, ToolPolicy, ToolRule
from agentruns.runtime.access import cache
from agentruns.tokens import hash_token, issue_token, user_for_token
from tests.helpers import ApiClient

pytestmark = pytest.mark.django_db

START = {"agent": "refund", "input": {"order_id": "ORD-1001", "message": "refund $15"}}


@pytest.fixture
def trainee(seeded, django_user_model):
    return django_user_model.objects.get(username="trainee")


def _start(api: ApiClient, order_id: str = "ORD-1001"):
    return api.post("/api/runs", {**START, "input": {**START["input"], "order_id": order_id}})


def _tools(response) -> dict:
    return Run.objects.get(id=response.json()["id"]).permissions


def test_a_repeated_start_reads_no_permission_table(trainee):
    api = ApiClient(trainee)
    assert _start(api).status_code == 201
    with CaptureQueriesContext(connection) as queries:
        response = _start(api, "ORD-1002")
    assert response.status_code == 201
    # (the test's transaction adds a savepoint around the start: not a statement of the start's)
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    tables = " ".join(statements)
    # the demo's refund agent keeps one run per order (issue 30): its start locks the order's
    # key (one upsert) and reads the order's line (one select); a run of an agent without a
    # key has neither
    line = [s for s in statements if "agentruns_concurrencykey" in s or "concurrency_key =" in s]
    assert len(line) == 2, tables
    statements = [s for s in statements if s not in line]
    # PostgreSQL: the in-flight count, the run, its event and the NOTIFY are one statement;
    # SQLite: five and a doorbell
    assert len(statements) == (3 if connection.vendor == "postgresql" else 7), tables
    for table in ("auth_group", "auth_permission", "agentruns_toolpolicy", "agentruns_toolrule"):
        assert f'"{table}"' not in tables.replace('"auth_group"."name"', "")
    # and the snapshot is the same as the one computed from the tables
    snapshot = _tools(response)
    assert snapshot["groups"] == ["trainees"] and snapshot["policies"] == ["trainees"]
    assert snapshot["tools"]["issue_refund"]["allowed"] is False
    assert snapshot["tools"]["lookup_order"]["allowed"] is True


def test_a_group_permission_removed_by_a_bulk_delete_refuses_the_next_start(trainee):
    api = ApiClient(trainee)
    assert _start(api).status_code == 201
    start_run = Permission.objects.get(codename="start_run")
    # a queryset delete: no m2m_changed signal, only the table's trigger sees it
    Group.permissions.through.objects.filter(permission=start_run).delete()
    response = _start(api)
    assert response.status_code == 403 and "start_run" in response.json()["error"]


def test_leaving_the_group_by_raw_sql_refuses_the_next_start(trainee):
    api = ApiClient(trainee)
    assert _start(api).status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM auth_user_groups WHERE user_id = %s", [trainee.pk])
    assert _start(api).status_code == 403
    trainee.groups.add(Group.objects.get(name="trainees"))  # the ORM's way back in
    assert _start(api).status_code == 201


def test_a_user_permission_granted_is_seen_at_once(seeded, django_user_model):
    viewer = django_user_model.objects.get(username="viewer")
    api = ApiClient(viewer)
    assert _start(api).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="start_run"))
    assert _start(api).status_code == 201


def test_a_superuser_demoted_by_a_queryset_update_is_refused(seeded, django_user_model):
    lead = django_user_model.objects.get(username="lead")
    api = ApiClient(lead)
    assert _start(api).status_code == 201
    django_user_model.objects.filter(pk=lead.pk).update(is_superuser=False)
    assert _start(api).status_code == 403


def test_policy_edits_reach_the_next_runs_snapshot(trainee):
    api = ApiClient(trainee)
    assert _tools(_start(api))["tools"]["issue_refund"]["allowed"] is False
    ToolRule.objects.filter(tool="issue_refund").update(allowed=True, approver_limit=12_000)
    tools = _tools(_start(api))["tools"]
    assert tools["issue_refund"]["allowed"] is True
    assert tools["issue_refund"]["limits"]["groups"] == {"trainees": 12_000}
    ToolPolicy.objects.filter(group__name="trainees").delete()  # the rules cascade
    after = _tools(_start(api))
    assert after["policies"] == [] and after["tools"]["issue_refund"]["allowed"] is True
    Group.objects.filter(name="trainees").update(name="juniors")
    assert _tools(_start(api))["groups"] == ["juniors"]


def test_every_write_to_a_watched_table_changes_the_generation(trainee):
    seen = {cache.current_generation()}
    group = Group.objects.get(name="trainees")
    writes = [
        lambda: group.permissions.remove(Permission.objects.get(codename="view_run")),
        lambda: trainee.groups.clear(),
        lambda: Group.objects.create(name="new"),
        lambda: Permission.objects.filter(codename="view_run").update(name="renamed"),
        lambda: ToolPolicy.objects.filter(group=group).update(note="edited"),
        lambda: ToolRule.objects.filter(tool="lookup_order").update(allowed=False),
    ]
    for write in writes:
        write()
        generation = cache.current_generation()
        assert generation is not None and generation not in seen
        seen.add(generation)


def test_the_one_statement_token_lookup_agrees_with_valid(django_user_model):
    """`ApiToken.authenticating` (raw SQL, built once) is `ApiToken.valid()` on the hash: the
    same tokens pass, and its user is the row the ORM loads, field by field."""
    user = django_user_model.objects.create_user("tok", password="pw-tok-123", email="t@x.org")
    raws = {name: issue_token(user) for name in ("ok", "revoked", "expired", "forever")}
    ApiToken.objects.filter(pk=raws["revoked"][1].pk).update(revoked=True)
    past = timezone.now() - timedelta(seconds=1)
    ApiToken.objects.filter(pk=raws["expired"][1].pk).update(expires_at=past)
    ApiToken.objects.filter(pk=raws["forever"][1].pk).update(expires_at=None)
    expected = set(ApiToken.valid().values_list("token_hash", flat=True))
    for name, (raw, _) in raws.items():
        found = ApiToken.authenticating(hash_token(raw))
        assert (found is not None) == (hash_token(raw) in expected), name
    assert ApiToken.authenticating(hash_token("art_unknown")) is None
    found = ApiToken.authenticating(hash_token(raws["ok"][0]))
    loaded = django_user_model.objects.get(pk=user.pk)
    for field in django_user_model._meta.concrete_fields:
        assert getattr(found.user, field.attname) == getattr(loaded, field.attname), field.name
    assert found.user.date_joined.tzinfo is not None and found.user.is_active is True
    assert found.access_generation == cache.current_generation()
    django_user_model.objects.filter(pk=user.pk).update(is_active=False)  # an inactive user
    assert ApiToken.authenticating(hash_token(raws["ok"][0])) is None
    assert user_for_token(raws["ok"][0]) is None
