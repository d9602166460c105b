"""`prompt_cache_key` goes only where it is known to be accepted (default-deny)."""

import pytest

from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.dispatch.model_side import cache_hint
from atmosphere.dispatch.runtime.openai import accepts_cache_key
from atmosphere.sdk import PromptCache, agent
from atmosphere.sdk.host import spec_of


@pytest.mark.parametrize(
    ("url", "mode", "sent"),
    [
        ("https://api.openai.com/v1", "auto", True),
        ("https://my-deployment.openai.azure.com/openai", "auto", True),
        ("http://127.0.0.1:8090/v1", "auto", True),
        ("http://localhost:11434/v1", "auto", True),
        ("https://api.groq.com/openai/v1", "auto", False),
        ("https://openai.com.evil.example/v1", "auto", False),
        ("https://api.groq.com/openai/v1", "enabled", True),
        ("https://api.openai.com/v1", "disabled", False),
        ("", "auto", False),
        ("https://api.openai.com/v1", " AUTO ", True),
    ],
)
def test_the_allow_list(url: str, mode: str, sent: bool) -> None:
    assert accepts_cache_key(url, mode) is sent


def test_hint_keys() -> None:
    @agent(name="a")
    class A: ...

    run = RunSubmission(conversation_id="c1")
    spec = spec_of(A)
    assert cache_hint(spec, AgentHarness(prompt_cache=PromptCache.NONE), run) is None
    conservative = cache_hint(spec, AgentHarness(prompt_cache=PromptCache.CONSERVATIVE), run)
    aggressive = cache_hint(spec, AgentHarness(prompt_cache=PromptCache.AGGRESSIVE), run)
    assert conservative is not None
    assert conservative.key == "atmo:a"
    assert aggressive is not None
    assert aggressive.key == "atmo:a:c1"
