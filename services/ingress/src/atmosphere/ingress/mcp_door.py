"""The MCP door: every agent the caller may use is an MCP tool, at `/atmosphere/mcp` (streamable HTTP).

    tools/list   one tool per agent the caller's grant covers: `{"message", "conversation_id"?}`;
                 with `ATMOSPHERE_MCP__TOOLS`, also the app's `@tool`s of those agents, each as
                 `<agent>__<tool>` with its own description and JSON schema (`app_tools`)
    tools/call   a run of that agent (transport "mcp"): its text streamed as progress
                 notifications, its answer as the result, its failure as an `isError` result;
                 for an app tool, a run of that agent with one tool call and no model (dispatch's
                 `direct_call`: the tool choke point's governance, roles, approval, journal,
                 screen and tape), its result the result, its error or refusal an `isError` one

Built on the `mcp` SDK's low-level server and its streamable HTTP session manager, so the wire,
both protocol eras (2025-11-25 sessions and the stateless 2026-07-28 requests) and the SDK's
own limits are the SDK's. Around it: the same token grants and owner rules as every other
door (a 401 before the SDK reads a byte; a stateful session is bound to its user), an `Origin`
allowed only when it is one of the CORS origins, the body bounded by the message limit.

A call cancelled by its client (`notifications/cancelled`, or the 2026 era's aborted POST)
cancels its run. A tool call that needs a human's approval asks the client to elicit it where the
client can (the 2025 era's `elicitation/create`; the 2026 era's `input_required` result, whose
retry answers the approval and follows the same run on); a client that cannot elicit gets an
`isError` result at once naming the doors that carry approvals, and the run is cancelled.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from atmosphere.bus import BusError, subjects
from atmosphere.bus.runs import TOOL_CALL_METADATA_KEY
from atmosphere.bus.telemetry import bind_run
from atmosphere.bus.text import has_lone_surrogate
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.contracts.tool.v1.tool_pb2 import ToolKind
from atmosphere.ingress.app_tools import SEPARATOR, AppTool, ToolDescriptors, app_tools, usable_by
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.door_runs import AnswerText, DoorRun, follow_owned_run, start_run
from atmosphere.ingress.errors import (
    AgentNotFoundError,
    ApprovalNotCarriedError,
    ForbiddenError,
    IngressError,
    MalformedRequestError,
    UnauthorizedError,
    UnavailableError,
)
from atmosphere.ingress.http import message_limit_of
from atmosphere.ingress.inbound import ApprovalReply, require_message_size, send_approval
from atmosphere.ingress.state import IngressState

log = logging.getLogger("atmosphere.ingress")

TRANSPORT = "mcp"
APPROVAL_INPUT = "approval"
"""The key of the 2026 era's elicitation request (and of its answer on the retry)."""
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Approve this tool call?"}},
    "required": ["approve"],
}
APPROVAL_DOORS = (
    "the WebSocket at /atmosphere/agent/{agent}, or SSE (POST /atmosphere/agent/{agent}) with approvals "
    "POSTed to /atmosphere/runs/<run>/approval, or an MCP client that supports elicitation"
)
REFUSED = -32001
"""The JSON-RPC code of a refused caller (server-defined range): the 401 and 403 bodies carry it too."""
ENVELOPE_BYTES = 64 * 1024
"""Room for the JSON-RPC envelope around a message of the largest size ingress admits."""


def agent_tool(agent: AgentDescriptor) -> types.Tool:
    """The MCP tool an agent is: a message in, its answer out."""
    return types.Tool(
        name=agent.name,
        title=agent.name,
        description=agent.description or f"Ask the agent '{agent.name}'.",
        input_schema={
            "type": "object",
            "properties": {
                "message": {"type": "string", "minLength": 1, "description": "What to ask the agent."},
                "conversation_id": {
                    "type": "string",
                    "pattern": r"^[A-Za-z0-9_\-:@]{1,128}$",
                    "description": "Continue this conversation (its history and files); a new one when absent.",
                },
            },
            "required": ["message"],
            "additionalProperties": False,
        },
    )


def app_tool(tool: AppTool) -> types.Tool:
    """The MCP tool an exposed app tool is: its own description and schema, its kind as hints."""
    kind = tool.descriptor.kind
    return types.Tool(
        name=tool.name,
        title=f"{tool.tool} ({tool.agent.name})",
        description=tool.descriptor.description or f"The tool '{tool.tool}' of the agent '{tool.agent.name}'.",
        input_schema=tool.input_schema,
        annotations=types.ToolAnnotations(
            read_only_hint=kind == ToolKind.TOOL_KIND_READ,
            destructive_hint=kind in {ToolKind.TOOL_KIND_EDIT, ToolKind.TOOL_KIND_DELETE, ToolKind.TOOL_KIND_EXECUTE},
            idempotent_hint=tool.descriptor.idempotent,
            open_world_hint=kind == ToolKind.TOOL_KIND_NETWORK,
        ),
        _meta={"atmosphere/agent": tool.agent.name, "atmosphere/tool": tool.tool},
    )


def error_result(error: IngressError | Error, *, run_id: str = "") -> types.CallToolResult:
    """A failed call as MCP wants it: an `isError` result the model can read, never a protocol error."""
    meta = {k: v for k, v in (("atmosphere/runId", run_id), ("atmosphere/code", error.code)) if v}
    return types.CallToolResult(
        content=[types.TextContent(text=f"Error: {error.message}")], is_error=True, _meta=meta or None
    )


@dataclass(frozen=True)
class PendingApproval:
    """What a 2026-era `input_required` result carries to its retry: the run waiting, and what for.

    Not sealed: the retry is checked against the run's owner like any resume, so a forged state
    can only name the caller's own runs.
    """

    run_id: str
    approval_id: str
    tool: str

    def encode(self) -> str:
        return json.dumps({"run": self.run_id, "approval": self.approval_id, "tool": self.tool})

    @classmethod
    def decode(cls, raw: str) -> PendingApproval | None:
        try:
            data = json.loads(raw)
            pending = cls(str(data["run"]), str(data["approval"]), str(data["tool"]))
            subjects.token(pending.run_id, what="run id")
        except (ValueError, TypeError, KeyError):
            return None
        return pending if pending.approval_id.startswith("apr_") else None


class ApprovalNotCarried(Exception):  # noqa: N818 - an outcome, not a failure of ours
    """The run asked for an approval this client cannot give (it declared no elicitation)."""


class McpDoor:
    """The MCP server of this ingress: its handlers, and the session manager the app's lifespan runs."""

    def __init__(self, state: IngressState) -> None:
        self.state = state
        self.exposed = state.settings.mcp.tools
        """The app's `@tool`s exposed too (`ATMOSPHERE_MCP__TOOLS`; none when empty)."""
        self.descriptors = ToolDescriptors(state.bus)
        self.server: Server[Any] = Server(
            "atmosphere", version="0.1.0", on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )
        limit = state.settings.ingress.max_message_bytes
        # A message of the largest size admitted, escaped as JSON (at most six bytes a byte), fits.
        options = state.settings.mcp
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            max_request_body_size=6 * limit + ENVELOPE_BYTES,
            security_settings=None,
            max_sessions=options.max_sessions,
            session_idle_timeout=options.session_idle_seconds,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve sessions until the context exits (then every session and call in flight is cancelled)."""
        async with self.manager.run():
            yield

    # -- the HTTP edge --------------------------------------------------------------------------

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate, check the origin, then hand the request to the SDK."""
        request = Request(scope)
        origin = request.headers.get("origin")
        allowed = self.state.settings.ingress.cors_origins
        if origin is not None and "*" not in allowed and origin not in allowed:
            # A page of another site must not drive a local agent through the user's browser.
            await _refuse(ForbiddenError("This Origin may not use the MCP endpoint"))(scope, receive, send)
            return
        try:
            caller = self.state.authenticator.identify(request.headers)
        except AuthError as exc:
            await _refuse(UnauthorizedError(exc.message))(scope, receive, send)
            return
        # The SDK binds a stateful session to this user: another token cannot use its session id.
        scope = dict(scope)
        scope["user"] = AuthenticatedUser(
            AccessToken(token=caller.principal.user_id or "anonymous", client_id=_user_key(caller), scopes=[])
        )
        await self.manager.handle_request(scope, receive, send)

    def _caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Who sent this message (its own HTTP request's credentials, checked again)."""
        request = ctx.request
        if not isinstance(request, Request):
            raise AuthError(401, "No HTTP request carries this call")
        return self.state.authenticator.identify(request.headers)

    # -- handlers ------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        del params
        # Raised as MCP errors of our own words: the SDK would send an exception's text as it is.
        try:
            caller = self._caller(ctx)
            agents = await self.state.directory.all()
            exposed = await self._app_tools(agents, caller)
        except AuthError as exc:
            raise MCPError(REFUSED, exc.message) from None
        except BusError as exc:
            log.warning("the MCP door could not list the agents or their tools: %s", exc)
            raise MCPError(INTERNAL_ERROR, "The agent directory is unavailable; try again") from None
        tools = [agent_tool(a) for a in agents if caller.may_use(a.path)]
        return types.ListToolsResult(tools=tools + [app_tool(exposed[name]) for name in sorted(exposed)])

    async def _app_tools(self, agents: list[AgentDescriptor], caller: Caller) -> dict[str, AppTool]:
        """The app tools exposed to `caller` (none unless `ATMOSPHERE_MCP__TOOLS` names some)."""
        if not self.exposed:
            return {}
        return usable_by(caller, app_tools(agents, await self.descriptors.all(), self.exposed))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            caller = self._caller(ctx)
            if params.request_state:
                return await self._resume(ctx, caller, params)
            return await self._new_call(ctx, caller, params)
        except IngressError as exc:
            return error_result(exc)
        except AuthError as exc:
            return error_result(UnauthorizedError(exc.message))
        except BusError as exc:
            log.warning("an MCP call failed on the bus: %s", exc)
            return error_result(UnavailableError("The agent is unavailable right now; try again"))

    async def _new_call(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.exposed and SEPARATOR in params.name:
            tool = await self._app_tool(params.name, caller)
            if tool is not None:
                return await self._tool_call(ctx, caller, tool, params.arguments or {})
        agent = await self._agent(params.name, caller)
        if agent is None:
            msg = f"Unknown tool {params.name[:128]!r}"
            raise AgentNotFoundError(msg)
        arguments = params.arguments or {}
        message = arguments.get("message")
        conversation = arguments.get("conversation_id")
        if not isinstance(message, str) or not message.strip():
            raise MalformedRequestError("'message' must be a non-empty string")
        if conversation is not None and not isinstance(conversation, str):
            raise MalformedRequestError("'conversation_id' must be a string")
        if unknown := sorted(set(arguments) - {"message", "conversation_id"}):
            msg = f"Unknown arguments: {', '.join(unknown)[:200]}"
            raise MalformedRequestError(msg)
        run = await start_run(
            self.state,
            caller,
            agent,
            message,
            transport=TRANSPORT,
            address=_address(ctx),
            conversation=conversation,
        )
        return await self._answer(ctx, run, AnswerText())

    async def _app_tool(self, name: str, caller: Caller) -> AppTool | None:
        """The exposed app tool `name` if `caller` may use its agent (None: an agent's name, or unknown)."""
        # An agent's own name is never an app tool's (`app_tools` leaves such a name out).
        return (await self._app_tools(await self.state.directory.all(), caller)).get(name)

    async def _tool_call(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, tool: AppTool, arguments: dict[str, Any]
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A run of `tool`'s agent with that one call and no model; its result (or error) the result.

        The arguments are checked against the tool's schema by dispatch's choke point, like a
        model's; admission sees the call as the run's message.
        """
        call = json.dumps({"name": tool.tool, "arguments": arguments}, ensure_ascii=False)
        if has_lone_surrogate(call):
            raise MalformedRequestError("The arguments contain a lone UTF-16 surrogate, which is not valid Unicode")
        require_message_size(call, message_limit_of(self.state))
        run = await start_run(
            self.state,
            caller,
            tool.agent,
            f"{tool.tool} {json.dumps(arguments, ensure_ascii=False)}",  # what admission's policies read
            transport=TRANSPORT,
            address=_address(ctx),
            metadata={TOOL_CALL_METADATA_KEY: call},
        )
        return await self._answer(ctx, run, AnswerText())

    async def _resume(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The 2026 era's retry after an approval was elicited: answer it, follow the same run on."""
        pending = PendingApproval.decode(params.request_state or "")
        if pending is None:
            raise MalformedRequestError("Unusable requestState")
        answer = (params.input_responses or {}).get(APPROVAL_INPUT)
        run = await follow_owned_run(self.state, caller, pending.run_id, address=_address(ctx))
        try:
            ack = await send_approval(
                self.state.bus, pending.run_id, _decision(pending.approval_id, answer), principal=caller.principal
            )
            if not ack.accepted:
                log.info("an elicited approval for run %s was not taken: %s", pending.run_id, ack.detail)
        except BaseException:
            await run.close()
            raise
        # The stored events come first: the answer is rebuilt whole, and the approval already
        # answered is not asked again.
        return await self._answer(ctx, run, AnswerText(), answered=pending.approval_id, replaying=True)

    async def _answer(
        self,
        ctx: ServerRequestContext[Any, Any],
        run: DoorRun,
        answer: AnswerText,
        *,
        answered: str = "",
        replaying: bool = False,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Follow `run` to its end: its text as progress, its answer (or error) as the result."""
        # A call runs in a task of the MCP session's, not the request's: it binds the run itself.
        with bind_run(run.run_id, run.agent):
            return await self._follow(ctx, run, answer, answered=answered, replaying=replaying)

    async def _follow(
        self,
        ctx: ServerRequestContext[Any, Any],
        run: DoorRun,
        answer: AnswerText,
        *,
        answered: str,
        replaying: bool,
    ) -> types.CallToolResult | types.InputRequiredResult:
        cancel: str | None = "the MCP client cancelled the call"
        try:
            async for event in run:
                kind = event.WhichOneof("kind")
                if replaying and kind == "metadata" and event.seq == 1:
                    continue
                text = answer.add(event)
                if text:
                    await ctx.session.report_progress(len(answer.text), None, text)
                elif kind == "approval_required" and event.approval_required.approval_id != answered:
                    decided = await self._approval(ctx, run, event)
                    if isinstance(decided, types.InputRequiredResult):
                        cancel = None  # the run waits for the retry's answer
                        return decided
                elif kind == "error" and not event.origin_run_id:
                    cancel = None
                    return error_result(event.error, run_id=run.run_id)
                elif kind == "complete" and not event.origin_run_id:
                    cancel = None
                    return types.CallToolResult(
                        content=[types.TextContent(text=answer.text)],
                        _meta={"atmosphere/runId": run.run_id, "atmosphere/finishReason": _finish(event)},
                    )
            cancel = None
            return error_result(UnavailableError("The run's events ended early; try again"), run_id=run.run_id)
        except ApprovalNotCarried as exc:
            cancel = "an approval cannot be given by this MCP client"
            agent = run.agent
            refusal = ApprovalNotCarriedError(
                f"The agent '{agent}' called the tool '{exc}', which needs a human's approval; this MCP client "
                f"cannot elicit one, so the run was cancelled and the tool did not run. Use a client that supports "
                f"elicitation, or {APPROVAL_DOORS.format(agent=agent)}."
            )
            return error_result(refusal, run_id=run.run_id)
        finally:
            await run.close(cancel_reason=cancel)

    async def _approval(
        self, ctx: ServerRequestContext[Any, Any], run: DoorRun, event: RunEvent
    ) -> types.InputRequiredResult | None:
        """Ask the client for the approval `event` needs: answered now (2025 era), or by the retry (2026)."""
        approval = event.approval_required
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            raise ApprovalNotCarried(approval.tool_name)
        question = (
            approval.message
            or f"The agent '{event.origin_agent or event.agent}' wants to call '{approval.tool_name}' with "
            f"{approval.arguments_json[:2000]}"
        )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            pending = PendingApproval(run.run_id, approval.approval_id, approval.tool_name)
            return types.InputRequiredResult(
                input_requests={
                    APPROVAL_INPUT: types.ElicitRequest(
                        params=types.ElicitRequestFormParams(message=question, requested_schema=APPROVAL_SCHEMA)
                    )
                },
                request_state=pending.encode(),
            )
        if not ctx.session.can_send_request:
            raise ApprovalNotCarried(approval.tool_name)
        result = await ctx.session.elicit_form(question, APPROVAL_SCHEMA, related_request_id=ctx.request_id)
        await send_approval(
            self.state.bus, run.run_id, _decision(approval.approval_id, result), principal=run.principal
        )
        return None

    async def _agent(self, name: str, caller: Caller) -> AgentDescriptor | None:
        try:
            subjects.token(name, what="agent name")
        except ValueError:
            return None
        agent = await self.state.directory.lookup(name)
        # An agent outside the caller's grant is not listed, so it is answered as unknown too.
        return agent if agent is not None and caller.may_use(agent.path) else None


def _decision(approval_id: str, answer: object) -> ApprovalReply:
    """The elicited answer as an approval reply: anything but an accepted `approve: true` denies."""
    approved = (
        isinstance(answer, types.ElicitResult)
        and answer.action == "accept"
        and (answer.content or {}).get("approve") is True
    )
    return ApprovalReply(approval_id, "approve" if approved else "deny")


def _finish(event: RunEvent) -> str:
    return event.complete.finish_reason or "stop"


def _user_key(caller: Caller) -> str:
    principal = caller.principal
    return f"{principal.auth_method}:{principal.tenant}:{principal.user_id}"


def _address(ctx: ServerRequestContext[Any, Any]) -> str:
    request = ctx.request
    if isinstance(request, Request) and request.client is not None:
        return request.client.host
    return ""


def _refuse(error: IngressError) -> JSONResponse:
    """A refusal an MCP client can read (a JSON-RPC error), with ingress's `code` beside it."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": REFUSED, "message": error.message}, "code": error.code}
    headers = {"WWW-Authenticate": 'Bearer realm="atmosphere"'} if error.status == 401 else None
    return JSONResponse(body, status_code=error.status, headers=headers)
