"""Admin reads of the harness workspaces: owners, plans and files (served by memory).

    GET /api/admin/workspace/owners                         [{owner, plan, filesystem}]
    GET /api/admin/agents/{name}/plan?sessionId=            the plan, shaped like `plan-update`
    GET /api/admin/agents/{name}/files?sessionId=&path=     a directory of the conversation's files
    GET /api/admin/agents/{name}/files/content?sessionId=&path=   one file's text

An owner is listed only when its plan or file surface genuinely attached (dispatch's
descriptor says so); anything else is a 404. Traversal-shaped ids and paths are a 400 here,
before anything reaches the bus, and memory validates them again.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.memory.v1.memory_pb2 import (
    GetPlanRequest,
    GetPlanResponse,
    ListFilesRequest,
    ListFilesResponse,
    ReadFileRequest,
    ReadFileResponse,
)
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.ingress.errors import AdminBadRequestError, AdminSurfaceAbsentError
from atmosphere.ingress.http import ADMIN_ERRORS, admin_call, admin_timeout

router = APIRouter()

MAX_PATH_CHARS = 1024
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
Name = Annotated[str, Path(json_schema_extra={"pattern": NAME_PATTERN})]
SESSION_PATTERN = r"^[A-Za-z0-9_\-:@]{1,160}$"
"""A conversation id (a user-scoped one is a 16-hex digest, `--`, and the client's id)."""
SessionId = Annotated[str, Query(max_length=160, json_schema_extra={"pattern": SESSION_PATTERN})]
FilePath = Annotated[str, Query(max_length=MAX_PATH_CHARS)]


def traversal_shaped(path: str) -> bool:
    """Whether a workspace path could point outside its root (the admin answers 400)."""
    if path in {"", "."}:
        return False
    normal = unicodedata.normalize("NFKC", path)
    if normal != path or "\\" in path or "\x00" in path or path.startswith("/"):
        return True
    return any(segment in {"", ".", ".."} for segment in path.split("/"))


async def _descriptor(bus: Bus, name: str) -> AgentDescriptor | None:
    items = await bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
    return items.get(name)


def _scope(descriptor: AgentDescriptor, session_id: str) -> WorkspaceScope:
    scope = WorkspaceScope()
    scope.CopyFrom(descriptor.workspace)
    scope.agent_id = descriptor.name
    scope.conversation_id = session_id
    return scope


def _plan_step(step: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {"content": step.content, "status": step.status}
    if step.active_form:
        wire["activeForm"] = step.active_form
    return wire


@router.get(
    "/api/admin/workspace/owners",
    summary="Owners with a plan store or a file workspace",
    responses=ADMIN_ERRORS,
)
async def workspace_owners(request: Request) -> Any:
    """`[{owner, plan, filesystem}]` for every agent whose plan or file surface attached."""

    async def ask(bus: Bus) -> list[dict[str, Any]]:
        items = await bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
        owners = []
        for name in sorted(items):
            harness = set(items[name].harness)
            if harness & {"planning", "filesystem"}:
                owners.append({"owner": name, "plan": "planning" in harness, "filesystem": "filesystem" in harness})
        return owners

    return await admin_call(request, "dispatch", ask)


async def _surface(request: Request, name: str, session_id: str, feature: str) -> AgentDescriptor:
    """The descriptor of `name` if it has `feature`; else the `AdminError` to answer with."""
    if not re.fullmatch(SESSION_PATTERN, session_id):
        raise AdminBadRequestError("Malformed sessionId")
    descriptor = await admin_call(request, "dispatch", lambda bus: _descriptor(bus, name))
    if descriptor is None or feature not in descriptor.harness:
        what = "plan store" if feature == "planning" else "file workspace"
        raise AdminSurfaceAbsentError(f"Agent '{name}' has no {what}")
    return descriptor


@router.get("/api/admin/agents/{name}/plan", summary="An agent's plan in one conversation", responses=ADMIN_ERRORS)
async def agent_plan(request: Request, name: Name, sessionId: SessionId) -> Any:  # noqa: N803
    """`{agent, sessionId, goal?, steps}` (steps as in `plan-update`)."""
    descriptor = await _surface(request, name, sessionId, "planning")

    async def ask(bus: Bus) -> Any:
        reply = await bus.request(
            subjects.memory("plan.get"),
            GetPlanRequest(workspace=_scope(descriptor, sessionId)),
            GetPlanResponse,
            timeout=admin_timeout(request),
        )
        if not reply.found:
            raise AdminSurfaceAbsentError(f"Agent '{name}' has no plan in conversation {sessionId}")
        plan = reply.plan
        body: dict[str, Any] = {"agent": name, "sessionId": sessionId}
        if plan.HasField("goal"):
            body["goal"] = plan.goal
        body["steps"] = [_plan_step(s) for s in plan.steps]
        return body

    return await admin_call(request, "memory", ask)


@router.get(
    "/api/admin/agents/{name}/files",
    summary="A directory of a conversation's workspace",
    responses=ADMIN_ERRORS,
)
async def agent_files(request: Request, name: Name, sessionId: SessionId, path: FilePath = ".") -> Any:  # noqa: N803
    """`{agent, sessionId, path, entries: [{path, size, directory}]}`."""
    if traversal_shaped(path):
        raise AdminBadRequestError("Malformed path")
    descriptor = await _surface(request, name, sessionId, "filesystem")

    async def ask(bus: Bus) -> Any:
        reply = await bus.request(
            subjects.memory("files.list"),
            ListFilesRequest(workspace=_scope(descriptor, sessionId), path=path),
            ListFilesResponse,
            timeout=admin_timeout(request),
        )
        entries = [{"path": e.path, "size": e.size, "directory": e.directory} for e in reply.entries]
        return {"agent": name, "sessionId": sessionId, "path": path or ".", "entries": entries}

    return await admin_call(request, "memory", ask)


@router.get(
    "/api/admin/agents/{name}/files/content", summary="One file of a conversation's workspace", responses=ADMIN_ERRORS
)
async def agent_file_content(request: Request, name: Name, sessionId: SessionId, path: FilePath) -> Any:  # noqa: N803
    """`{agent, sessionId, path, content}`."""
    if not path or path == "." or traversal_shaped(path):
        raise AdminBadRequestError("Malformed path")
    descriptor = await _surface(request, name, sessionId, "filesystem")

    async def ask(bus: Bus) -> Any:
        reply = await bus.request(
            subjects.memory("files.read"),
            ReadFileRequest(workspace=_scope(descriptor, sessionId), path=path),
            ReadFileResponse,
            timeout=admin_timeout(request),
        )
        return {"agent": name, "sessionId": sessionId, "path": path, "content": reply.content}

    return await admin_call(request, "memory", ask)
