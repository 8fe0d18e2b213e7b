"""awooop worker SDK: claim runs, keep leases alive, journal steps, end runs.

    from awooop.worker import RunContext, Worker

    async def handle(ctx: RunContext) -> dict:
        diagnosis = await ctx.step("diagnose", diagnose, step_type="llm_call")
        ...
        return {"done": True}

    await Worker(handle, projects=["demo"]).run()

See docs/worker-sdk.md.
"""

from awooop.worker.children import Child, ChildHandle, ChildOutcome, ChildrenTimeout
from awooop.worker.client import Client, open_channel
from awooop.worker.context import Approval, RunContext
from awooop.worker.errors import AwooopError, ErrorDetails, LeaseLost, RunFinished, details_of
from awooop.worker.replay import Nondeterminism
from awooop.worker.run_scope import StepCall
from awooop.worker.structs import from_struct, to_struct
from awooop.worker.tools import ToolClient
from awooop.worker.waits import ParkedToolFailed, RunParked, WaitTimeout, WaitToken
from awooop.worker.watch import Event, TokenChannel, TokenGap, Tokens, watch_run
from awooop.worker.worker import Worker, WorkerError, run_worker

__all__ = [
    "Approval",
    "AwooopError",
    "Child",
    "ChildHandle",
    "ChildOutcome",
    "ChildrenTimeout",
    "Client",
    "ErrorDetails",
    "Event",
    "LeaseLost",
    "Nondeterminism",
    "ParkedToolFailed",
    "RunContext",
    "RunFinished",
    "RunParked",
    "StepCall",
    "TokenChannel",
    "TokenGap",
    "Tokens",
    "ToolClient",
    "WaitTimeout",
    "WaitToken",
    "Worker",
    "WorkerError",
    "details_of",
    "from_struct",
    "open_channel",
    "run_worker",
    "to_struct",
    "watch_run",
]
