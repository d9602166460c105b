"""An ADK `LlmAgent` naming no model: the pool's configured Gemini client runs it.

ADK names a tool after its function, hence the three small functions.
"""

from __future__ import annotations

from google.adk.agents import LlmAgent

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text


def native_lookup(city: str) -> str:
    """Current weather for a city, the framework's own way.

    Args:
        city: The city's name.
    """
    return native_lookup_text(city)


def native_forbidden(target: str) -> str:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    return native_forbidden_text(target)


def native_transfer(amount: int) -> str:
    """Move money (the operator's tool permissions make a human confirm it).

    Args:
        amount: How much.
    """
    return native_transfer_text(amount)


hosted = LlmAgent(
    name="adk", instruction="You answer briefly.", tools=[native_lookup, native_forbidden, native_transfer]
)
