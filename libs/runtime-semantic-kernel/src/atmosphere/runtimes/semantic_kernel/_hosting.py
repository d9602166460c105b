"""Hosting a user's own `ChatCompletionAgent`: its kernel functions, as specs and as gated calls.

Every function call of the agent's auto-invocation loop passes `ctx.run_tool` with `local` set:
the run's kernel (a clone of the agent's, so concurrent runs and the agent itself are untouched)
gets an auto-function-invocation filter, SK's extension point for exactly this, innermost of
its filters. The agent's own filters run first (they may change the arguments, answer the call
themselves or end the loop, as they would without the platform); then the gate hands the call
to the choke point, whose `local` invokes the function once every gate passed. A refused call
never reaches the function: the model reads the refusal's `Error: ...` text.

What SK settles before any filter runs is left to SK, and runs nothing: a call naming a
function the kernel does not have, one outside the function-choice behaviour's `filters`, one
whose arguments miss a required parameter or are not JSON is answered by SK's own text.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.connectors.ai.function_calling_utils import kernel_function_metadata_to_function_call_format
from semantic_kernel.contents import TextContent
from semantic_kernel.contents.kernel_content import KernelContent
from semantic_kernel.exceptions import FunctionExecutionException
from semantic_kernel.filters import AutoFunctionInvocationContext
from semantic_kernel.functions import FunctionResult, KernelFunctionMetadata

from atmosphere.runtimes.semantic_kernel._tools import arguments_json
from atmosphere.sdk.host import render_result
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner, ToolSpec

Next = Callable[[AutoFunctionInvocationContext], Awaitable[None]]


def native_tool_specs(agent: ChatCompletionAgent) -> tuple[ToolSpec, ...]:
    """The functions of the agent's kernel as the model is shown them: `plugin-function`, SK's schema.

    SK names a plugin's function `<plugin>-<function>` to the model (its fully qualified name),
    so that is the name the choke point validates and governs.
    """
    return tuple(_spec(metadata) for metadata in agent.kernel.get_full_list_of_function_metadata())


def _spec(metadata: KernelFunctionMetadata) -> ToolSpec:
    declared = kernel_function_metadata_to_function_call_format(metadata)["function"]
    return ToolSpec(name=declared["name"], description=declared["description"], parameters=declared["parameters"])


class Gate:
    """The auto-function-invocation filter of a hosted run: each call passes `run_tool` before the function runs."""

    def __init__(self, run_tool: ToolRunner) -> None:
        """Gate with `run_tool`."""
        self._run_tool = run_tool

    async def __call__(self, context: AutoFunctionInvocationContext, next: Next) -> None:  # SK passes `next` by name
        """Hand the call to the choke point, with the function itself as its `local`; its text is the result."""
        del next  # the function is invoked by `local`, after the gates, or not at all
        call = context.function_call_content
        name = context.function.fully_qualified_name
        asked = arguments_json(call) if call is not None else "{}"

        async def local(arguments: str) -> str:
            return await _invoke(context, asked, arguments)

        request = ToolCallRequest(
            call_id=(call.id if call else None) or "", name=name, arguments_json=asked, local=local
        )
        text = await self._run_tool(request)
        context.function_result = FunctionResult(function=context.function.metadata, value=text)


async def _invoke(context: AutoFunctionInvocationContext, asked: str, arguments: str) -> str:
    """Invoke the function with the arguments the gates let through (an approver may have edited them).

    What SK's innermost handler does, except that a failing function raises, so the choke point
    reports the call as failed (SK would hand the model its exception's text as a result). A
    misfit of the arguments is the model's to fix, so it reads as an `Error: ...` text.
    """
    try:
        approved = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        approved = None
    if not isinstance(approved, dict):
        return f"Error: the arguments of {context.function.fully_qualified_name} are not a JSON object"
    for key in _object(asked):
        context.arguments.pop(key, None)  # the model's arguments make way for the approved ones
    context.arguments.update(approved)
    call = context.function_call_content
    metadata = (call.metadata | call.to_dict()) if call is not None else {}
    try:
        result = await context.function.invoke(context.kernel, context.arguments, metadata=metadata)
    except FunctionExecutionException as exc:
        return f"Error: {exc}"
    return _text(result.value if result is not None else None)


def _object(text: str) -> dict[str, object]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _text(value: object) -> str:
    """A function's value as the model reads it: text as it is, SK content as SK renders it, the rest as JSON."""
    if isinstance(value, TextContent):
        return value.text
    if isinstance(value, KernelContent):
        return str(value)
    return render_result(value)
