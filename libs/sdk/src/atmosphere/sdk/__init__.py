"""What Atmosphere users import to write agents."""

from atmosphere.sdk._agent import AgentSpec, agent, prompt, spec_of
from atmosphere.sdk._app import App, load_app
from atmosphere.sdk._session import EventSink, StreamingSession
from atmosphere.sdk.errors import SdkError, UserError

__all__ = [
    "AgentSpec",
    "App",
    "EventSink",
    "SdkError",
    "StreamingSession",
    "UserError",
    "agent",
    "load_app",
    "prompt",
    "spec_of",
]
