"""A LlamaIndex `FunctionAgent` with three tools of its own, on an LLM at the platform's provider.

A LlamaIndex agent built without an LLM resolves `Settings.llm` (OpenAI's) when it is built, so the
object carries one, as its users' do.
"""

from __future__ import annotations

import os

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text

llm = OpenAILike(
    model=os.environ.get("LLM_MODEL", "fake-model"),
    api_base=os.environ.get("LLM_BASE_URL") or "http://127.0.0.1:9/v1",
    api_key=os.environ.get("LLM_API_KEY", "unused"),
    is_chat_model=True,
    is_function_calling_model=True,
    additional_kwargs={"stream_options": {"include_usage": True}},
)
hosted = FunctionAgent(
    name="llamaindex",
    system_prompt="You answer briefly.",
    llm=llm,
    tools=[
        FunctionTool.from_defaults(fn=native_lookup_text, name="native_lookup"),
        FunctionTool.from_defaults(fn=native_forbidden_text, name="native_forbidden"),
        FunctionTool.from_defaults(fn=native_transfer_text, name="native_transfer"),
    ],
)
