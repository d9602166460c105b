"""The app of the payload-limit suite: a tool whose result size the test chooses, and agents.

`toolbox` answers with the model and may call `produce`; `filer` too, with a file workspace (a
long result is offloaded to it); `chat` has conversation memory (its history goes to the
model); `echo` is the plain run that shows a service still works.
"""

from atmosphere.sdk import App, Harness, agent, tool
from examples.echo import Echo


@tool
def produce(size: int, char: str = "x") -> str:
    """A text of `size` characters.

    Args:
        size: How many characters.
        char: The character repeated.
    """
    return char * size


@agent(name="toolbox", system_prompt="Use the tools.", tools=[produce], harness=[])
class Toolbox:
    """Calls `produce` when the (scripted) model asks for it."""


@agent(name="filer", system_prompt="Use the tools.", tools=[produce], harness=[Harness.FILESYSTEM])
class Filer:
    """Calls `produce`; a result longer than the offload threshold goes to its workspace."""


@agent(name="chat", system_prompt="You remember the conversation.", harness=[Harness.MEMORY])
class Chat:
    """Answers with the model, with the conversation's history."""


app = App(agents=[Echo, Toolbox, Filer, Chat])
