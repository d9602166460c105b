"""Two apps for the remote delegation suite: stack B serves `researcher` over its A2A door, stack
A's coordinator has it as a remote fleet member (its URL and token given by A's deployment).

ATMOSPHERE_APP=tests.e2e.apps.remote_fleet_app:remote_app (B), tests.e2e.apps.remote_fleet_app:app (A)
"""

from __future__ import annotations

from atmosphere.sdk import App, RemoteAgent, agent, coordinator


@agent(name="researcher", description="Finds sources.", system_prompt="You find sources.", harness=[])
class Researcher:
    """A model agent on another deployment."""


@coordinator(
    name="lead",
    description="Leads the research.",
    system_prompt="You delegate research to your fleet.",
    # Where it is comes from the deployment (ATMOSPHERE_DELEGATION__REMOTES), as does its token.
    fleet=[RemoteAgent("researcher", description="Finds sources, on another deployment.")],
)
class Lead:
    """A coordinator whose only fleet member is remote."""


remote_app = App(agents=[Researcher])
app = App(agents=[Lead])
