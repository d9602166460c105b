"""The app of the soak: one model agent with conversation memory, so that every run reads and
writes a conversation's history (memory) besides being admitted (governance) and recorded (tape)."""

from atmosphere.sdk import App, Harness, agent

AGENT = "talker"


@agent(name=AGENT, system_prompt="Answer in full.", harness=[Harness.MEMORY])
class Talker:
    """Streams the model's (slow) answer."""


app = App(agents=[Talker])
