"""The console's end-to-end app: `notes` (an approval before `delete_note`), `coder` (plan and files),
`concierge` (a coordinator whose `task` runs a sub-agent) and its crew, and `artist` (artifacts)."""

from __future__ import annotations

import struct
import zlib

from atmosphere.contracts.run.v1.run_pb2 import Content, RunEvent
from atmosphere.sdk import App, StreamingSession, agent, prompt
from examples.approvals import Notes
from examples.coding_agent import Coder
from examples.personal_assistant import Concierge, Researcher, Writer


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A plain-colour PNG (what a `code_exec` plot arrives as: bytes in a `content` event)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@agent(name="artist", description="Answers with a picture and a file, without a model.", harness=[])
class Artist:
    """Sends an image and a CSV file as `content` events, then a line of text."""

    @prompt
    async def on_prompt(self, message: str, session: StreamingSession) -> None:
        del message
        image = Content(
            content_type="image", mime_type="image/png", data=png(40, 20, (11, 92, 173)), file_name="plot.png"
        )
        await session.emit(RunEvent(content=image))
        table = Content(content_type="file", mime_type="text/csv", data=b"x,y\n1,2\n", file_name="data.csv")
        await session.emit(RunEvent(content=table))
        await session.send("Here is the plot and its data.")
        await session.complete()


app = App(agents=[Coder, Notes, Concierge, Researcher, Writer, Artist])
