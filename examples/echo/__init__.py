"""The echo agent: streams the user's message back word by word.

Run it with `ATMOSPHERE_APP=examples.echo:app` (the default of `make run` until a model is
configured) and talk to `ws://127.0.0.1:8080/atmosphere/agent/echo`.
"""

from atmosphere.sdk import App, StreamingSession, agent, prompt


# No model loop for a harness to complete: a bare agent (`harness=[]`).
@agent(name="echo", description="Streams your message back, word by word.", harness=[])
class Echo:
    """Echoes the prompt."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        words = message.split(" ")
        for i, word in enumerate(words):
            await session.send(word if i == len(words) - 1 else word + " ")
        await session.complete()


app = App(agents=[Echo])
