"""A Semantic Kernel `ChatCompletionAgent` with no chat service of its own: the platform's model runs it.

The model sees SK's `plugin-function` names: `native-lookup`, `native-forbidden`, `native-transfer`.
"""

from __future__ import annotations

from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.functions import KernelPlugin, kernel_function

from tests.e2e.apps.adapters_app import native_forbidden_text, native_lookup_text, native_transfer_text


class NativeTools:
    """The agent's own plugin."""

    @kernel_function(name="lookup", description="Weather for a city.")
    def lookup(self, city: str) -> str:
        return native_lookup_text(city)

    @kernel_function(name="forbidden", description="Open a target.")
    def forbidden(self, target: str) -> str:
        return native_forbidden_text(target)

    @kernel_function(name="transfer", description="Move an amount of money.")
    def transfer(self, amount: int) -> str:
        return native_transfer_text(amount)


hosted = ChatCompletionAgent(
    name="semantic", instructions="You answer briefly.", plugins=[KernelPlugin.from_object("native", NativeTools())]
)
