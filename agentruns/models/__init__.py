"""The persisted truth of the runtime (DESIGN.md section 3), one module per concept: runs and
their steps (`runs`), who may do what (`access`), rows every process shares (`shared`:
heartbeats, quota buckets, concurrency keys), the operation keys across runs
(`operations`). Every model is importable from here, as Django and
the migrations expect of the app's `models`."""

from agentruns.models.access import (
    AccessGeneration,
    ApiToken,
    ApprovalOverride,
    ToolPolicy,
    ToolRule,
)
from agentruns.models.journal import (
    HookReceipt,
    JournalEntry,
    ResumePoint,
    Wait,
    WaitKind,
    WaitStatus,
)
from agentruns.models.operations import (
    OperationAllowance,
    OperationExecution,
    OperationState,
)
from agentruns.models.runs import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    TERMINAL_RUN_STATUSES,
    TERMINAL_STEP_STATUSES,
    AttemptOutcome,
    Run,
    RunEvent,
    RunStatus,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
)
from agentruns.models.shared import (
    ConcurrencyKey,
    ModelRateBucket,
    QuotaBucket,
    WorkerHeartbeat,
)
from agentruns.models.threads import Author, Thread, ThreadKey, ThreadMessage, ThreadTurn

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "TERMINAL_RUN_STATUSES",
    "TERMINAL_STEP_STATUSES",
    "AccessGeneration",
    "ApiToken",
    "ApprovalOverride",
    "AttemptOutcome",
    "Author",
    "ConcurrencyKey",
    "HookReceipt",
    "ModelRateBucket",
    "OperationAllowance",
    "OperationExecution",
    "OperationState",
    "JournalEntry",
    "ResumePoint",
    "QuotaBucket",
    "Run",
    "RunEvent",
    "RunStatus",
    "Step",
    "StepAttempt",
    "StepKind",
    "StepStatus",
    "Thread",
    "ThreadKey",
    "ThreadMessage",
    "ThreadTurn",
    "ToolPolicy",
    "ToolRule",
    "Wait",
    "WaitKind",
    "WaitStatus",
    "WorkerHeartbeat",
]
