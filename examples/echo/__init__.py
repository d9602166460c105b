"""The echo agent: streams the user's message back word by word.

Run it with `ATMOSPHERE_APP=examples.echo:app` (the default of `make run` until a model is
configured) and talk to `ws://127.0.0.1:8080/atmosphere/agent/echo`.
"""

import asyncio

from atmosphere.sdk import App, StreamingSession, agent, prompt

WORD_GAP = 0.02
"""Seconds between two words, as a model types: words sent faster than dispatch's delta window
(`ATMOSPHERE_DISPATCH__TEXT_DELTA_WINDOW_MS`, 5 ms) would reach the client joined in one frame."""


# No model loop for a harness to complete: a bare agent (`harness=[]`).
@agent(name="echo", description="Streams your message back, word by word.", harness=[])
class Echo:
    """Echoes the prompt."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        words = message.split(" ")
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(WORD_GAP)
            await session.send(word if i == len(words) - 1 else word + " ")
        await session.complete()


app = App(agents=[Echo])
