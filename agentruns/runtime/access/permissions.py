"""The permission snapshot: what a run may do, computed once when it starts (DESIGN.md 3, 4.6).

    {"user": "trainee", "groups": ["trainees"], "policies": ["trainees"], "taken_at": "...",
     "tools": {"lookup_order": {"allowed": true, "approval": "tool", ...},
               "issue_refund": {"allowed": false, "approval": "tool", "approvals": "predicate",
                                "amount_arg": "amount_cents",
                                "limits": {"default": null, "groups": {"approver": 30000}}}}}

Rules (group policies are `ToolPolicy` rows, edited in the admin):
- a user in no group with a policy gets the agent's tools unchanged;
- otherwise a tool is allowed when any of the user's policies allows it (groups grant, as
  Django's permissions do);
- a policy can only add approval: "always" from any of the user's policies parks every call,
  the tool's own rule holds in any case;
- approvers' limits are frozen for every group that sets one for the tool (the approver's
  groups at decision time pick from them), with AGENTRUNS_APPROVER_LIMIT_CENTS as the default.

What the database says (groups, policies, limits) is kept per process under the access
generation (`cache.py`): any write to those tables is seen by the next start.

The run keeps the snapshot: retry and resume read it, a policy edited later does not change it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import ApprovalOverride, Run, ToolPolicy, ToolRule
from agentruns.registry import Tool, UnknownTool, get_tool
from agentruns.runtime.access import cache
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso


@dataclass(frozen=True)
class _Policy:
    group: str
    other_tools_allowed: bool
    rules: dict[str, tuple[bool, str]]  # tool -> (allowed, approval override)


@dataclass(frozen=True)
class _Grants:
    """What the database says about a user's tools: their groups, those groups' policies."""

    groups: tuple[str, ...]
    policies: tuple[_Policy, ...]


def _grants(user: Any) -> _Grants:
    if user is None or not getattr(user, "is_authenticated", False):
        return _Grants((), ())
    return cache.remembered(user, "grants", lambda: _read_grants(user))


def _read_grants(user: Any) -> _Grants:
    groups = tuple(sorted(user.groups.values_list("name", flat=True)))
    if not groups:
        return _Grants((), ())
    policies = (
        ToolPolicy.objects.filter(group__name__in=groups)
        .select_related("group")
        .prefetch_related("rules")
        .order_by("group__name")
    )
    return _Grants(
        groups,
        tuple(
            _Policy(
                p.group.name,
                p.other_tools_allowed,
                {r.tool: (r.allowed, r.approval) for r in p.rules.all()},
            )
            for p in policies
        ),
    )


def _tool(name: str) -> Tool | None:
    try:
        return get_tool(name)
    except UnknownTool:  # (a fork of a run whose tool is gone): not allowed, nothing to say
        return None


def default_limit() -> int | None:
    return conf.APPROVER_LIMIT_CENTS or None


def snapshot(user: Any, tool_names: Iterable[str]) -> dict:
    """The permissions a run started by `user` (None: a trusted in-process caller) has."""
    names = list(tool_names)
    tools = {name: _tool(name) for name in names}
    grants = _grants(user)
    policies = grants.policies
    limited = tuple(sorted(n for n, t in tools.items() if t is not None and t.amount_arg))
    limits = _group_limits(user, limited)
    out: dict[str, dict] = {}
    for name, tool in tools.items():
        allowing, always = [], False
        for policy in policies:
            rule = policy.rules.get(name)
            if rule[0] if rule is not None else policy.other_tools_allowed:
                allowing.append(policy.group)
            always = always or (rule is not None and rule[1] == ApprovalOverride.ALWAYS)
        entry: dict[str, Any] = {
            "allowed": tool is not None and (not policies or bool(allowing)),
            "allowed_by": allowing if policies else None,
            "approval": ApprovalOverride.ALWAYS if always else ApprovalOverride.TOOL,
        }
        if tool is not None:
            policy = tool.policy()
            entry["tool_approval"] = policy["approval"]
            entry["approvals"] = policy["approvals"]
            if tool.amount_arg:
                entry["amount_arg"] = tool.amount_arg
                entry["limits"] = {"default": default_limit(), "groups": dict(limits.get(name, ()))}
        out[name] = entry
    return {
        "user": actor_name(user) or None,
        "groups": list(grants.groups),
        "policies": [p.group for p in policies],
        "tools": out,
        "taken_at": iso(timezone.now()),
    }


def _group_limits(user: Any, names: tuple[str, ...]) -> dict[str, tuple[tuple[str, int], ...]]:
    """tool -> ((group, the most its approvers may approve), ...), for every group that sets one
    (every group's, not only the user's: kept under the access generation all the same)."""
    if not names:
        return {}
    if user is None or not getattr(user, "is_authenticated", False):
        return _read_group_limits(names)
    return cache.remembered(user, ("limits", names), lambda: _read_group_limits(names))


def _read_group_limits(names: tuple[str, ...]) -> dict[str, tuple[tuple[str, int], ...]]:
    rows = ToolRule.objects.filter(tool__in=names, approver_limit__isnull=False).values_list(
        "tool", "policy__group__name", "approver_limit"
    )
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for tool, group, limit in rows:
        out[tool].append((group, limit))
    return {tool: tuple(pairs) for tool, pairs in out.items()}


def require_approval(snapshot: dict | None, tool_snapshot: dict, because: dict[str, str]) -> dict:
    """`snapshot` with every tool named in `because` (tool -> why) under approval "always", the
    reason kept beside it (`approval_because`, shown on the run page): a fork repeating its
    source's side effects, a retry that skipped a call whose outcome is unknown. Only adds
    approval, as a policy does; a tool the snapshot does not allow stays not allowed."""
    marked = dict(snapshot or {})
    tools = {name: dict(entry) for name, entry in (marked.get("tools") or {}).items()}
    for name, why in because.items():
        if name not in tool_snapshot:
            continue
        entry = tools.setdefault(name, {"allowed": True, "approval": ApprovalOverride.TOOL})
        entry["approval"] = ApprovalOverride.ALWAYS
        entry["approval_because"] = why
    marked["tools"] = tools
    return marked


def needs_approval(run: Run, tool: Tool, arguments: dict) -> bool:
    """The tool's own rule, or an "always" from the starter's policies (which only add)."""
    if tool.needs_approval(arguments):
        return True
    return run.tool_permission(tool.name).get("approval") == ApprovalOverride.ALWAYS


def refused_message(run: Run, name: str) -> str:
    """Why the model may not call `name` in this run (fed back to it as the step's error)."""
    if name not in run.tool_snapshot:
        return f"tool {name!r} is not available to this run"
    who = (run.permissions or {}).get("user") or "its starter"
    return f"tool {name!r} is not allowed in this run (the tool policy of {who}'s groups)"
