"""A slow streamer: `"<words> <seconds between words>"` streams `w0 w1 …` at that pace.

It keeps runs streaming for a known time, so a test can break the broker or a worker
mid-answer and then check that every word arrived exactly once.
"""

import asyncio

from atmosphere.sdk import App, StreamingSession, agent, prompt


@agent(name="ticker", description="Streams numbered words slowly.", harness=[])
class Ticker:
    """Streams `count` words, `pause` seconds apart."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        count_text, _, pause_text = message.partition(" ")
        count, pause = int(count_text), float(pause_text or "0")
        for n in range(count):
            await session.send(f"w{n} ")
            await asyncio.sleep(pause)
        await session.complete()


app = App(agents=[Ticker])
