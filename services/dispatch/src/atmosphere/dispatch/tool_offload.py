"""The offload stage of the tool choke point: an over-long result goes to the run's workspace.

The model gets a preview and the path(s), and reads the rest with `read_file` when it needs it.
A result too large for one save request or one file is saved in parts, in order (at most
`MAX_OFFLOAD_PARTS`). With no workspace, a disabled threshold, or any failure to save, the
result stays inline (and is then cut to what one run event carries, with a marker).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.sizes import head, utf8_len
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import ToolCall, ToolReply, WorkspaceScope
from atmosphere.sdk.builtin_tools import OFFLOAD_PREVIEW_CHARS, offload_path, offload_preview

log = logging.getLogger("atmosphere.dispatch")

OFFLOAD_PART_BYTES = 256 * 1024
"""The most UTF-8 bytes of a result saved in one workspace file (memory's per-file limit is 512 KiB)."""
MAX_OFFLOAD_PARTS = 16
"""A result is saved in at most this many files; beyond them it is cut, and the preview says so."""
_SAVE_ROOM = 1024
"""Bytes of a save request besides the part's JSON text (the path, the JSON keys)."""


def _json_len(text: str) -> int:
    return utf8_len(json.dumps(text, ensure_ascii=False))


def split_for_saving(
    content: str,
    *,
    max_json_bytes: int,
    max_part_bytes: int = OFFLOAD_PART_BYTES,
    max_parts: int | None = None,
) -> list[str]:
    """`content` in consecutive parts, each at most `max_part_bytes` of UTF-8 and `max_json_bytes` as JSON.

    With `max_parts`, at most that many parts plus one: whether more followed is all the caller
    needs to know of the rest, and a large result is not split further for nothing.
    """
    parts: list[str] = []
    position = 0
    while position < len(content) and (max_parts is None or len(parts) <= max_parts):
        piece = head(content[position : position + max_part_bytes], max_part_bytes)
        while (size := _json_len(piece)) > max_json_bytes:
            # Escapes make the JSON longer than the text: shrink in proportion, with some slack.
            piece = piece[: max(1, len(piece) * max_json_bytes // size - 16)]
        parts.append(piece)
        position += len(piece)
    return parts


def _parts_preview(content: str, paths: list[str], saved_chars: int) -> str:
    """What the model sees of a result saved in several files."""
    hidden = len(content) - OFFLOAD_PREVIEW_CHARS
    listing = ", ".join(paths)
    note = (
        f"[... {hidden} chars truncated. Full output saved in {len(paths)} parts, in order: {listing}"
        " — use read_file to read them.]"
    )
    if saved_chars < len(content):
        note += (
            f"\n[Only the first {saved_chars} of {len(content)} chars were saved: at most {MAX_OFFLOAD_PARTS}"
            " parts are kept.]"
        )
    return f"{content[:OFFLOAD_PREVIEW_CHARS]}\n\n{note}"


@dataclass(frozen=True)
class Offload:
    """One run's offload of long results, through memory's `write_file` into its workspace."""

    bus: Bus
    run: RunSubmission
    workspace: WorkspaceScope | None
    threshold: int
    """Results longer than this go to a workspace file (0 or less: never)."""
    enabled: bool
    data_limit: int
    """The most bytes one bus message carries (a save request included)."""

    async def __call__(self, tool: str, content: str) -> str:
        """`content`, or a preview naming where it was saved."""
        if not self.enabled or self.workspace is None or self.threshold <= 0:
            return content
        if len(content) <= self.threshold:
            return content
        parts = split_for_saving(content, max_json_bytes=self.data_limit - _SAVE_ROOM, max_parts=MAX_OFFLOAD_PARTS)
        path = offload_path(tool)
        if len(parts) == 1:
            return offload_preview(content, path) if await self._save(tool, path, content) else content
        kept = parts[:MAX_OFFLOAD_PARTS]
        paths = [f"{path.removesuffix('.txt')}.part{index}.txt" for index in range(1, len(kept) + 1)]
        for part_path, part in zip(paths, kept, strict=True):
            if not await self._save(tool, part_path, part):
                return content
        return _parts_preview(content, paths, sum(len(part) for part in kept))

    async def _save(self, tool: str, path: str, content: str) -> bool:
        """Write one offload file through memory's `write_file`; whether it was stored."""
        try:
            save = ToolCall(
                call_id=uuid.uuid4().hex,
                name="write_file",
                # Not ASCII-escaped: a non-Latin result would be up to six times longer on the wire.
                arguments_json=json.dumps({"path": path, "content": content}, ensure_ascii=False),
                run_id=self.run.run_id,
                conversation_id=self.run.conversation_id,
                agent=self.run.agent,
                principal=self.run.principal,
                workspace=self.workspace,
            )
        except ValueError:  # a lone surrogate cannot travel unescaped; the result stays inline
            return False
        try:
            reply = await self.bus.request(subjects.memory_tool("write_file"), save, ToolReply, timeout=10.0)
        except BusError as exc:
            log.debug("run %s: offload of %s failed (%s); inline", self.run.run_id, tool, exc)
            return False
        if reply.is_error:
            log.debug("run %s: offload of %s refused (%s); inline", self.run.run_id, tool, reply.content)
            return False
        return True
