"""Delegation across deployments: `researcher` served by one over A2A, `lead` on another delegating to it.

    # deployment B: serves `researcher` (and its A2A door) on port 8081
    atmosphere dev --app examples.remote_fleet:researcher_app --home .atmosphere-b --http-port 8081 \
        --nats-port 4322 --probe-base-port 8281 --grpc-port 50052 --model-port 8091
    # deployment A: `lead`, whose fleet member `researcher` is B's
    atmosphere dev --app examples.remote_fleet:app

`delegate_task(agent="researcher", ...)` from `lead`'s model sends the message to B's agent over
A2A: only this declared URL is reachable, governance admits each call as a delegation edge, and
B's answer is the tool's result. A's deployment may move the member and give it a token
(`ATMOSPHERE_DELEGATION__REMOTES`); dispatch needs its `a2a` extra (installed by `make install`).
"""

from __future__ import annotations

from atmosphere.sdk import App, RemoteAgent, agent, coordinator


@agent(name="researcher", description="Finds sources on a topic.", system_prompt="Name three good sources.")
class Researcher:
    """Served by deployment B."""


@coordinator(
    name="lead",
    description="Plans research and delegates the digging.",
    system_prompt="Delegate source-finding to the researcher, then summarise what it found.",
    fleet=[RemoteAgent("researcher", "http://127.0.0.1:8081/atmosphere/a2a/researcher", description="Finds sources.")],
)
class Lead:
    """Served by deployment A; its only fleet member is B's `researcher`."""


researcher_app = App(agents=[Researcher])
app = App(agents=[Lead])
