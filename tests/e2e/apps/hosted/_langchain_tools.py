"""The LangChain tools and model the hosted LangChain agent and LangGraph graph share."""

from __future__ import annotations

import os

from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text


@langchain_tool
def native_lookup(city: str) -> str:
    """Current weather for a city, the framework's own way.

    Args:
        city: The city's name.
    """
    return native_lookup_text(city)


@langchain_tool
def native_forbidden(target: str) -> str:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    return native_forbidden_text(target)


@langchain_tool
def native_transfer(amount: int) -> str:
    """Move money (the operator's tool permissions make a human confirm it).

    Args:
        amount: How much.
    """
    return native_transfer_text(amount)


NATIVE_TOOLS = [native_lookup, native_forbidden, native_transfer]


def user_model() -> ChatOpenAI:
    """The model a LangChain user configures: here, the test's provider."""
    return ChatOpenAI(
        model="fake-model",
        base_url=os.environ.get("LLM_BASE_URL") or "http://127.0.0.1:9/v1",
        api_key=SecretStr("user-key"),
        stream_usage=True,
        max_retries=0,
    )
