"""Hosting a user's own compiled graph (a LangChain agent is one): its tools found, every call governed.

The interception point is the graph's `ToolNode`s (LangGraph's prebuilt tool executor, which
`create_agent` uses too, with the agent's `wrap_tool_call` middleware composed into it: middleware
cannot be added to a compiled agent). Each run works on a copy of the graph whose ToolNodes are
rebuilt with the same tools and settings plus an outermost `awrap_tool_call` gate. The gate hands the
model's call to the choke point with `local` set; only `local` runs the node's own chain (the user's
wrappers or the agent's middleware, then the tool). The user's graph object is never changed, so
concurrent runs with different runners, and the user's own direct use of the graph, do not see each
other.

Which runtime hosts which graph is `atmosphere.langchain_bridge.runtime`'s (`made_by_create_agent`).
A tool called other than through a ToolNode (a custom node invoking it directly) is out of the
choke point's sight: a hosted graph runs its tools in ToolNodes. A tool's exception, an `interrupt()`
included, is the model's to read as `Error: ...`: approvals are the platform's, not the graph's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import AsyncToolCallWrapper
from langgraph.prebuilt.tool_node import ToolCallRequest as NodeToolCall
from langgraph.pregel import Pregel
from langgraph.types import Command

from atmosphere.sdk.errors import UserError
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

ToolResult = ToolMessage | Command[Any]
Execute = Callable[[NodeToolCall], Awaitable[ToolResult]]


def tool_specs(graph: Pregel[Any, Any, Any, Any]) -> tuple[ToolSpec, ...]:
    """The specs of the tools `graph`'s ToolNodes run, each schema as the model is offered it."""
    tools = {tool.name: tool for node in _tool_nodes(graph) for tool in node.tools_by_name.values()}
    return tuple(_spec(tool) for tool in tools.values())


def governed(graph: Pregel[Any, Any, Any, Any], run_tool: ToolRunner) -> Pregel[Any, Any, Any, Any]:
    """A copy of `graph` (and of its subgraphs) whose ToolNodes pass every call through `run_tool`."""
    nodes = dict(graph.nodes)
    for name, node in graph.nodes.items():
        if isinstance(node.bound, ToolNode):
            nodes[name] = node.copy({"bound": _governed_tool_node(node.bound, run_tool)})
        elif isinstance(node.bound, Pregel):
            subgraph = governed(node.bound, run_tool)
            nodes[name] = node.copy({"bound": subgraph, "subgraphs": [subgraph]})
    return graph.copy({"nodes": nodes})


def _tool_nodes(graph: Pregel[Any, Any, Any, Any]) -> Iterator[ToolNode]:
    for node in graph.nodes.values():
        if isinstance(node.bound, ToolNode):
            yield _hostable(node.bound)
        elif isinstance(node.bound, Pregel):
            yield from _tool_nodes(node.bound)


def _hostable(node: ToolNode) -> ToolNode:
    # ToolNode runs a sync-only wrapper with a sync executor, which an async gate cannot hand on
    # (the private attributes: see `_governed_tool_node`).
    if node._awrap_tool_call is None and node._wrap_tool_call is not None:
        msg = f"the ToolNode {node.name!r} has only a synchronous wrap_tool_call: give it an awrap_tool_call to host it"
        raise UserError(msg)
    return node


def _spec(tool: BaseTool) -> ToolSpec:
    parameters = convert_to_openai_tool(tool)["function"].get("parameters", {"type": "object", "properties": {}})
    return ToolSpec(name=tool.name, description=tool.description, parameters=parameters)


def _governed_tool_node(node: ToolNode, run_tool: ToolRunner) -> ToolNode:
    # ToolNode has no public accessors for its settings: these private attributes are its own
    # constructor's arguments, read back to build the same node with the gate in front.
    inner = _hostable(node)._awrap_tool_call
    return ToolNode(
        list(node.tools_by_name.values()),
        name=node.name or "tools",
        tags=list(node.tags) if node.tags else None,
        handle_tool_errors=node._handle_tool_errors,
        messages_key=node._messages_key,
        awrap_tool_call=_gate(run_tool, inner),
    )


def _gate(run_tool: ToolRunner, inner: AsyncToolCallWrapper | None) -> AsyncToolCallWrapper:
    """The outermost wrapper: the choke point decides, and runs the node's own chain through `local`."""

    async def gate(request: NodeToolCall, execute: Execute) -> ToolResult:
        call = request.tool_call
        call_id = call["id"] or ""
        produced: list[tuple[str, ToolResult]] = []

        async def local(arguments_json: str) -> str:
            edited = request.override(tool_call={**call, "args": json.loads(arguments_json)})
            try:
                result = await (inner(edited, execute) if inner is not None else execute(edited))
            except Exception as exc:
                # A tool's failure is the model's to read, as for any Atmosphere tool.
                return f"Error: {exc}"
            text = _text(result, call_id)
            produced.append((text, result))
            return text

        arguments_json = json.dumps(call["args"], ensure_ascii=False)
        text = await run_tool(ToolCallRequest(call_id, call["name"], arguments_json, local=local))
        if produced and produced[-1][0] == text:
            # Passed through unchanged: keep the tool's own result (its artifact, status, or Command).
            return produced[-1][1]
        return ToolMessage(text, tool_call_id=call_id, name=call["name"])

    return gate


def _text(result: ToolResult, call_id: str) -> str:
    """What the model reads of a tool's result (a Command's: the tool message it carries for the call)."""
    if isinstance(result, ToolMessage):
        return str(result.text)
    update = result.update if isinstance(result.update, dict) else {}
    messages = update.get("messages", [])
    return next((str(m.text) for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == call_id), "")
