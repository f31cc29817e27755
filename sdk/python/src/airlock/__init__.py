"""Airlock's Python SDK: sandboxes for AI agents on a self-hosted Airlock.

>>> import airlock
>>> with airlock.Airlock() as c, c.sandboxes.create(template="base") as sb:
...     print(sb.commands.run("echo hi").stdout)
"""

from ._async import (AsyncAirlock, AsyncCommandHandle, AsyncOperation, AsyncSandbox, AsyncSandboxPage)
from ._errors import (AirlockError, Conflict, Forbidden, Gone, InvalidRequest, NotFound, OperationFailed,
                      QuotaExceeded, RateLimited, Unauthorized, Unavailable)
from ._models import (Build, BuildEvent, Checkpoint, CommandResult, Event, FileInfo, NetworkLog, OperationInfo,
                      OutputEvent, Template)
from ._sync import Airlock, CommandHandle, Operation, Sandbox, SandboxPage

__version__ = "0.1.0"

__all__ = [
    "Airlock", "AsyncAirlock", "Sandbox", "AsyncSandbox", "SandboxPage", "AsyncSandboxPage",
    "Operation", "AsyncOperation", "CommandHandle", "AsyncCommandHandle",
    "AirlockError", "InvalidRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "Gone",
    "QuotaExceeded", "RateLimited", "Unavailable", "OperationFailed",
    "Build", "BuildEvent", "Checkpoint", "CommandResult", "Event", "FileInfo", "NetworkLog",
    "OperationInfo", "OutputEvent", "Template", "__version__",
]
