"""LangChain's `create_agent`, as its users build one, its model pointed at the test's provider."""

from __future__ import annotations

from langchain.agents import create_agent

from tests.e2e.apps.hosted._langchain_tools import NATIVE_TOOLS, user_model

hosted = create_agent(user_model(), NATIVE_TOOLS, system_prompt="You answer briefly.")
