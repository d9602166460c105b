"""Two agents in two dispatch pools: `plain` in the default pool, `pinned` in the `built-in` runtime's own.

Both run the built-in runtime, so the pools need no framework installed; what differs is where
their runs are queued and which process takes them.
"""

from atmosphere.sdk import App, agent


@agent(name="plain", harness=[])
class Plain:
    """Answers from the default pool."""


@agent(name="pinned", harness=[], runtime="built-in")
class Pinned:
    """Answers from the built-in runtime's own pool."""


app = App(agents=[Plain, Pinned])
