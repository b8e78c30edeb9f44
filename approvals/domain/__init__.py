"""The approvals domain: deciding an item (outcomes: first decision wins, each decision and what
it does to the run), who may decide what (policy), the runtime's side of the inbox (parking),
each person's decision and the two-person count (decisions), claims, escalation and the inbox's
queries (selectors). Above it: the one decision service (`approvals.services`) and the runtime's
inbox port (`approvals.inbox`); below it: notifications, errors and the models."""
