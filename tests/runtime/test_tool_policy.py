"""Tool policies per group, frozen into each run's permission snapshot (DESIGN.md 3, 4.6, 4.8).

In-process: what the snapshot says for each combination of groups, that the model is offered
only the allowed tools and a call to another one is a failed step fed back to it, "always"
overrides, retry and fork. On a real worker (qcluster + daphne as the gateway): a trainee's
refund run hands over without refunding, and a policy edited while it runs does not change it.
"""

from __future__ import annotations

import httpx
import pytest
from django.contrib.auth.models import Group

from agentruns.models import Run, RunStatus, Step, StepStatus, ToolPolicy, ToolRule
from agentruns.registry import Agent, ScriptedTurn, register_agent
from agentruns.services import fork_run, retry_run, start_run
from agentruns.tokens import create_token
from approvals import errors, services
from approvals.domain import policy
from approvals.models import Approval, ApprovalStatus
from support.models import GatewayRefund, OutboxMessage, TicketNote
from tests import testkit
from tests.conftest import make_user
from tests.helpers import advance, steps
from tests.procs import start_web, start_worker, wait_until

OFFERED: list[list[str]] = []  # the tool names each model turn was offered


def probe_policy(messages: list[dict], tools: list[str]) -> ScriptedTurn:
    """Records what it is offered; calls t_charge whether offered or not (a model that
    ignores its tool list), then reads what came back."""
    OFFERED.append(list(tools))
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return ScriptedTurn(text="charging", tool_calls=[("t_charge", {"amount": 7})])
    return ScriptedTurn(text="result: " + messages[-1]["content"])


register_agent(
    Agent(
        name="policy-probe",
        instructions="Probe.",
        tools=["t_echo", "t_charge", "t_pay"],
        scripted_policy=probe_policy,
    )
)


@pytest.fixture(autouse=True)
def _clear_offered():
    OFFERED.clear()
    yield
    OFFERED.clear()


def policy_for(group: str, rules: dict[str, dict], *, others: bool = False) -> ToolPolicy:
    made = ToolPolicy.objects.create(
        group=Group.objects.get_or_create(name=group)[0], other_tools_allowed=others
    )
    for tool, fields in rules.items():
        ToolRule.objects.create(policy=made, tool=tool, **fields)
    return made


def member(django_user_model, name: str, *groups: str, perms: tuple[str, ...] = ()):
    user = make_user(django_user_model, name, ["agentruns.start_run", "agentruns.view_run", *perms])
    user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])
    return user


def tools_of(run: Run) -> dict[str, dict]:
    return run.permissions["tools"]


# ------------------------------------------------------------------ in-process
@pytest.mark.django_db
def test_no_policy_group_means_the_agents_tools_unchanged(lead, django_user_model):
    policy_for("clerks", {"t_echo": {}})  # exists, but neither user is a clerk
    plain = member(django_user_model, "plain", "approver")  # a group without a policy
    for user in (lead, plain, None):
        run = start_run("policy-probe", {}, user=user).run
        assert run.permissions["user"] == (user.username if user else None)
        assert run.permissions["policies"] == []
        assert {t: e["allowed"] for t, e in tools_of(run).items()} == {
            "t_echo": True,
            "t_charge": True,
            "t_pay": True,
        }
        assert all(e["approval"] == "tool" for e in tools_of(run).values())
    run = advance(run)
    assert sorted(OFFERED[0]) == ["t_charge", "t_echo", "t_pay"]
    assert len(testkit.CALLS["t_charge"]) == 1 and run.status == RunStatus.SUCCEEDED


@pytest.mark.django_db
def test_the_model_is_offered_only_allowed_tools_and_another_call_is_fed_back(
    django_user_model, client
):
    policy_for("clerks", {"t_echo": {}, "t_charge": {"allowed": False}})
    clerk = member(django_user_model, "clerk", "clerks")
    run = start_run("policy-probe", {}, user=clerk).run
    assert run.permissions["groups"] == ["clerks"] and run.permissions["policies"] == ["clerks"]
    assert {t: e["allowed"] for t, e in tools_of(run).items()} == {
        "t_echo": True,
        "t_charge": False,  # denied by its rule
        "t_pay": False,  # not listed in a whitelist
    }
    run = advance(run)
    assert OFFERED == [["t_echo"], ["t_echo"]]
    refused = Step.objects.get(run=run, index=1)
    assert refused.tool == "t_charge" and refused.status == StepStatus.FAILED
    assert refused.attempts == 0 and "not allowed in this run" in refused.error
    assert testkit.CALLS["t_charge"] == []  # never executed
    # the model read the refusal as the tool's result, and the run went on
    assert run.status == RunStatus.SUCCEEDED and "not allowed" in run.output
    # the run page and the API show the snapshot
    client.force_login(clerk)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'data-tool="t_charge" data-allowed="false"' in page and "clerks" in page
    client.force_login(make_user(django_user_model, "looker", ["agentruns.view_run"]))
    body = client.get(f"/api/runs/{run.id}").json()
    assert body["permissions"]["user"] == "clerk" and body["permissions"]["groups"] == ["clerks"]
    assert body["permissions"]["tools"]["t_charge"]["allowed"] is False


@pytest.mark.django_db
def test_groups_combine_allowed_tools_add_and_approvals_only_get_stricter(django_user_model):
    policy_for("clerks", {"t_echo": {}})
    policy_for("payers", {"t_charge": {"approval": "always"}, "t_pay": {}}, others=False)
    both = member(django_user_model, "both", "clerks", "payers")
    snapshot = tools_of(start_run("policy-probe", {}, user=both).run)
    assert {t: e["allowed"] for t, e in snapshot.items()} == {
        "t_echo": True,
        "t_charge": True,
        "t_pay": True,
    }
    assert snapshot["t_echo"]["allowed_by"] == ["clerks"]
    assert snapshot["t_charge"]["approval"] == "always"  # one policy said so: it holds
    # t_pay needs approval above 100 by its own rule; "as the tool says" never waives it
    assert snapshot["t_pay"]["approval"] == "tool" and snapshot["t_pay"]["tool_approval"] == (
        "predicate"
    )


@pytest.mark.django_db
def test_always_parks_a_call_the_tool_would_run_and_tool_rules_are_never_waived(
    django_user_model,
):
    policy_for("payers", {"t_charge": {"approval": "always"}, "t_pay": {}}, others=True)
    payer = member(django_user_model, "payer", "payers")
    script = {"script": [{"calls": [["t_charge", {"amount": 3}]]}, {"text": "ok"}]}
    run = advance(start_run("script", script, user=payer).run)
    assert run.status == RunStatus.WAITING and testkit.CALLS["t_charge"] == []
    assert Approval.objects.get(run=run).tool == "t_charge"
    # the same script by someone without that policy runs straight through
    assert advance(start_run("script", script).run).status == RunStatus.SUCCEEDED
    pay = {"script": [{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}]}
    assert advance(start_run("script", pay, user=payer).run).status == RunStatus.WAITING


@pytest.mark.django_db
def test_edits_apply_to_later_runs_retry_keeps_the_snapshot_fork_takes_the_forkers(
    django_user_model, lead
):
    clerks = policy_for("clerks", {"t_echo": {}, "t_explode": {}})
    clerk = member(django_user_model, "clerk", "clerks", perms=("agentruns.operate_run",))
    script = {
        "script": [
            {"calls": [["t_explode", {}]]},
            {"calls": [["t_charge", {"amount": 9}]]},
            {"text": "done"},
        ]
    }
    before = advance(start_run("script", script, user=clerk).run)
    assert before.status == RunStatus.FAILED  # t_explode: a fatal tool error
    frozen = before.permissions
    ToolRule.objects.create(policy=clerks, tool="t_charge")  # the policy changes afterwards
    after = start_run("script", script, user=clerk).run
    assert tools_of(after)["t_charge"]["allowed"] is True

    retry_run(before.id, user=lead)
    retried = Run.objects.get(id=before.id)
    assert retried.permissions == frozen  # retry keeps the run's snapshot
    assert tools_of(retried)["t_charge"]["allowed"] is False

    # a fork is started by the forking user: it gets their permissions, not the source's
    source = advance(start_run("script", {"script": [{"text": "hi"}]}, user=lead).run)
    fork = fork_run(source.id, 0, user=clerk)
    assert fork.permissions["user"] == "clerk" and tools_of(fork)["t_pay"]["allowed"] is False
    assert tools_of(source)["t_pay"]["allowed"] is True


@pytest.mark.django_db
def test_approver_limits_by_group_replace_the_single_setting(seeded, settings, django_user_model):
    """Limits by group, frozen with the run: the approver group may approve up to 30.00, the
    seniors up to 1000.00, anyone else the default AGENTRUNS_APPROVER_LIMIT_CENTS."""
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 5000
    policy_for("approver", {"issue_refund": {"approver_limit": 3000}}, others=True)
    policy_for("seniors", {"issue_refund": {"approver_limit": 100_000}}, others=True)
    approver = django_user_model.objects.get(username="approver")
    senior = member(
        django_user_model,
        "senior",
        "seniors",
        perms=("approvals.view_approval", "approvals.decide_approval"),
    )
    other = make_user(django_user_model, "other", ["approvals.decide_approval"])
    run = advance(start_run("refund", {"order_id": "ORD-1004", "message": "broken"}).run)
    approval = Approval.objects.select_related("run").get(run=run)
    assert approval.requested_args["amount_cents"] > 5000
    assert tools_of(run)["issue_refund"]["limits"] == {
        "default": 5000,
        "groups": {"approver": 3000, "seniors": 100_000},
    }
    assert policy.approver_limit(approval, approver) == 3000
    assert policy.approver_limit(approval, senior) == 100_000
    assert policy.approver_limit(approval, other) == 5000
    # frozen: raising the group's limit now does not change this run's
    ToolRule.objects.filter(tool="issue_refund", policy__group__name="approver").update(
        approver_limit=900_000
    )
    with pytest.raises(errors.NotAllowed, match="above your approval limit of 30.00"):
        services.approve(approval.id, user=approver)
    services.approve(approval.id, user=senior)
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.APPROVED


@pytest.mark.django_db
def test_a_lead_edits_a_policy_in_the_admin_and_the_next_run_follows_it(
    lead, client, django_user_model
):
    interns = Group.objects.create(name="interns")
    intern = member(django_user_model, "intern", "interns")
    client.force_login(lead)
    form = client.get("/admin/agentruns/toolpolicy/add/").content.decode()
    assert '<option value="issue_refund">' in form  # the registered tools to choose from
    response = client.post(
        "/admin/agentruns/toolpolicy/add/",
        {
            "group": interns.id,
            "other_tools_allowed": "on",
            "note": "no charges",
            "rules-TOTAL_FORMS": "1",
            "rules-INITIAL_FORMS": "0",
            "rules-MIN_NUM_FORMS": "0",
            "rules-MAX_NUM_FORMS": "1000",
            "rules-0-tool": "t_charge",
            "rules-0-approval": "tool",
            "rules-0-approver_limit": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert "t_charge: not allowed" in client.get("/admin/agentruns/toolpolicy/").content.decode()
    snapshot = tools_of(start_run("policy-probe", {}, user=intern).run)
    assert snapshot["t_charge"]["allowed"] is False and snapshot["t_echo"]["allowed"] is True


# ------------------------------------------------------------------ on a real worker
def ledger(web: str, order_id: str) -> list[dict]:
    response = httpx.get(f"{web}/gateway/refunds", params={"order_id": order_id}, timeout=10)
    return response.json()["refunds"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_trainee_run_on_a_real_worker_hands_over_and_ignores_a_policy_edit_mid_run(
    seeded, tmp_path, django_user_model
):
    trainees = ToolPolicy.objects.get(group__name="trainees")
    # park the trainee's run on its first tool call, so the policy can change while it is live
    ToolRule.objects.filter(policy=trainees, tool="lookup_order").update(approval="always")
    web, url = start_web(tmp_path)
    worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway")
    try:
        trainee = django_user_model.objects.get(username="trainee")
        approver = django_user_model.objects.get(username="approver")
        as_trainee = {"Authorization": f"Bearer {create_token(trainee)}"}
        as_approver = {"Authorization": f"Bearer {create_token(approver)}"}
        body = {"agent": "refund", "input": {"order_id": "ORD-1007", "message": "It broke"}}
        created = httpx.post(url + "/api/runs", json=body, headers=as_trainee, timeout=30)
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        snapshot = created.json()["permissions"]
        assert snapshot["user"] == "trainee" and snapshot["groups"] == ["trainees"]
        assert snapshot["tools"]["issue_refund"]["allowed"] is False
        assert snapshot["tools"]["lookup_order"]["allowed"] is True

        lookup = wait_until(
            lambda: Approval.objects.filter(run_id=run_id, status="pending").first(),
            timeout=120,
            message="the lookup to park",
        )
        # mid-run, a lead edits the trainees' policy: refunds allowed, no approval for lookups
        ToolRule.objects.filter(policy=trainees, tool="issue_refund").update(allowed=True)
        ToolRule.objects.filter(policy=trainees, tool="lookup_order").update(approval="tool")
        decided = httpx.post(
            f"{url}/api/approvals/{lookup.id}",
            json={"decision": "approve"},
            headers=as_approver,
            timeout=30,
        )
        assert decided.status_code == 200, decided.text

        def finished(rid):
            run = Run.objects.get(id=rid)
            return run if run.is_terminal else None

        run = wait_until(lambda: finished(run_id), timeout=120, message="the trainee's run")
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert "a colleague will take over" in run.output
        assert ledger(url, "ORD-1007") == []  # the gateway executed nothing
        assert GatewayRefund.objects.filter(order_id="ORD-1007").count() == 0
        # the trainee's run hands the request over (issue 34: a hand-over is an inbox item)
        assert [s.tool for s in steps(run) if s.kind == "tool"] == [
            "lookup_order",
            "hand_over",
            "add_ticket_note",
            "send_customer_reply",
        ]
        assert Approval.objects.filter(run_id=run_id, kind="handover").count() == 1
        assert "A colleague will take over" in OutboxMessage.objects.get(run_id=run.id).body
        assert TicketNote.objects.filter(
            ticket__order__order_id="ORD-1007", body__startswith="Hand-over"
        ).exists()
        detail = httpx.get(f"{url}/api/runs/{run_id}", headers=as_trainee, timeout=30).json()
        assert detail["permissions"] == snapshot  # the edit did not reach this run

        # the edit applies to runs started after it: this one refunds (no approval needed here)
        body["input"]["order_id"] = "ORD-1008"
        later = httpx.post(url + "/api/runs", json=body, headers=as_trainee, timeout=30).json()
        assert later["permissions"]["tools"]["issue_refund"]["allowed"] is True
        run = wait_until(lambda: finished(later["id"]), timeout=120, message="the later run")
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert len(ledger(url, "ORD-1008")) == 1
    finally:
        worker.stop()
        web.stop()
