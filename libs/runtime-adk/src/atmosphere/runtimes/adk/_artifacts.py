"""ADK's artifact service over the conversation's file workspace, through the choke point.

A hosted agent's `save_artifact` / `load_artifact` (its tools' `tool_context`, its callbacks,
ADK's `load_artifacts` tool) reach the conversation's workspace (`Harness.FILESYSTEM`) as the
harness's own file tools — `write_file`, `read_file`, `ls`, `delete` — each call made through
`ctx.run_tool`, so it is governed, journaled and shown to the client like any other tool call.

The layout, under the workspace root:

- `artifacts/<filename>`: a text artifact (a `text` part, or inline data of a text MIME type),
  stored as its text;
- `artifacts/<filename>.base64`: a binary artifact, stored as one `data:<mime>;base64,<payload>`
  line (the workspace holds UTF-8 text only);
- `user:`-scoped artifacts under `artifacts/user/`: the workspace is the conversation's, so they
  live as long as it does.

The workspace keeps one content per path: saving again replaces it. Versions are counted for the
run (`save_artifact` returns 0, 1, … as ADK expects), but only the latest content can be loaded;
an older version loads as None.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from typing import Any

from google.adk.artifacts.base_artifact_service import ArtifactVersion, BaseArtifactService, ensure_part
from google.genai import types

from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner

ROOT = "artifacts"
USER_PREFIX = "user:"
USER_DIR = "user"
BINARY_SUFFIX = ".base64"
FILE_TOOLS = frozenset({"write_file", "read_file", "ls", "delete"})
"""The harness file tools the bridge calls: offered to the run, it is on."""
_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.S)
_NEXT_PAGE = re.compile(r"\n…\[truncated: .* Call read_file with offset=(\d+) to read on\.\]$", re.S)
_LISTED = re.compile(r"^(.*) \(\d+ bytes\)$")
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml", "application/javascript")


class WorkspaceArtifactService(BaseArtifactService):
    """ADK's `BaseArtifactService` whose store is the conversation's workspace (see the module docstring)."""

    def __init__(self, run_tool: ToolRunner) -> None:
        """Store through `run_tool` (the run's choke point)."""
        self._run_tool = run_tool
        self._versions: dict[str, int] = {}

    async def save_artifact(
        self,
        *,
        app_name: str,
        user_id: str,
        filename: str,
        artifact: types.Part | dict[str, Any],
        session_id: str | None = None,
        custom_metadata: dict[str, Any] | None = None,
    ) -> int:
        """Write the artifact's text (or base64 data URL) to the workspace; its version for this run."""
        del app_name, user_id, session_id, custom_metadata
        part = ensure_part(artifact)
        text, binary = _stored(part, filename)
        path = _path(filename, binary=binary)
        result = await self._call("write_file", {"path": path, "content": text})
        if result.startswith("Error"):
            msg = f"artifact {filename!r} could not be saved: {result}"
            raise ValueError(msg)
        # The other spelling of the name (text vs binary) would shadow or outlive this one.
        await self._call("delete", {"path": _path(filename, binary=not binary)})
        version = self._versions.get(filename, -1) + 1
        self._versions[filename] = version
        return version

    async def load_artifact(
        self,
        *,
        app_name: str,
        user_id: str,
        filename: str,
        session_id: str | None = None,
        version: int | None = None,
    ) -> types.Part | None:
        """The artifact's latest content, or None (missing, or an older `version` asked for)."""
        del app_name, user_id, session_id
        if version is not None and version != self._versions.get(filename, 0):
            return None
        text = await self._read(_path(filename, binary=False))
        if text is not None:
            return types.Part.from_text(text=text)
        encoded = await self._read(_path(filename, binary=True))
        return None if encoded is None else _binary_part(encoded)

    async def list_artifact_keys(self, *, app_name: str, user_id: str, session_id: str | None = None) -> list[str]:
        """Every artifact of the workspace, session- and user-scoped, by the names they were saved under."""
        del app_name, user_id, session_id
        names = [name for name in await self._list(ROOT) if name != f"{USER_DIR}/"]
        names += [USER_PREFIX + name for name in await self._list(f"{ROOT}/{USER_DIR}")]
        return sorted({name.removesuffix(BINARY_SUFFIX) for name in names if not name.endswith("/")})

    async def delete_artifact(
        self, *, app_name: str, user_id: str, filename: str, session_id: str | None = None
    ) -> None:
        """Delete the artifact, whichever way it was stored."""
        del app_name, user_id, session_id
        for binary in (False, True):
            await self._call("delete", {"path": _path(filename, binary=binary)})
        self._versions.pop(filename, None)

    async def list_versions(
        self, *, app_name: str, user_id: str, filename: str, session_id: str | None = None
    ) -> list[int]:
        """The one version the workspace holds, if any."""
        found = await self.get_artifact_version(
            app_name=app_name, user_id=user_id, filename=filename, session_id=session_id
        )
        return [] if found is None else [found.version]

    async def list_artifact_versions(
        self, *, app_name: str, user_id: str, filename: str, session_id: str | None = None
    ) -> list[ArtifactVersion]:
        """The one version the workspace holds, with its metadata, if any."""
        found = await self.get_artifact_version(
            app_name=app_name, user_id=user_id, filename=filename, session_id=session_id
        )
        return [] if found is None else [found]

    async def get_artifact_version(
        self,
        *,
        app_name: str,
        user_id: str,
        filename: str,
        session_id: str | None = None,
        version: int | None = None,
    ) -> ArtifactVersion | None:
        """The metadata of the version the workspace holds (the latest), if any."""
        part = await self.load_artifact(
            app_name=app_name, user_id=user_id, filename=filename, session_id=session_id, version=version
        )
        if part is None:
            return None
        binary = part.inline_data is not None
        mime = part.inline_data.mime_type if part.inline_data is not None else "text/plain"
        uri = f"workspace:{_path(filename, binary=binary)}"
        return ArtifactVersion(version=self._versions.get(filename, 0), canonical_uri=uri, mime_type=mime)

    async def _read(self, path: str) -> str | None:
        """A workspace file's whole text (read page by page), or None when it cannot be read."""
        pages: list[str] = []
        offset = 0
        while True:
            arguments: dict[str, Any] = {"path": path} if not offset else {"path": path, "offset": offset}
            page = await self._call("read_file", arguments)
            if page.startswith("Error"):
                return None if not pages else "".join(pages)
            more = _NEXT_PAGE.search(page)
            if more is None:
                pages.append(page)
                return "".join(pages)
            pages.append(page[: more.start()])
            offset = int(more.group(1))

    async def _list(self, directory: str) -> list[str]:
        """The names directly under `directory` (relative to it), directories with a trailing `/`."""
        listing = await self._call("ls", {"dir": directory})
        if listing.startswith("Error") or listing == "(empty)":
            return []
        names = []
        for line in listing.splitlines():
            sized = _LISTED.match(line)
            path = sized.group(1) if sized else line
            names.append(path.removeprefix(f"{directory}/"))
        return names

    async def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        call = ToolCallRequest(
            call_id=f"adk-artifact-{uuid.uuid4().hex}", name=tool, arguments_json=json.dumps(arguments)
        )
        return await self._run_tool(call)


def offers_file_tools(names: frozenset[str]) -> bool:
    """Whether a run offers the harness file tools the bridge needs (the FILESYSTEM harness)."""
    return names >= FILE_TOOLS


def _path(filename: str, *, binary: bool) -> str:
    name = f"{USER_DIR}/{filename.removeprefix(USER_PREFIX)}" if filename.startswith(USER_PREFIX) else filename
    return f"{ROOT}/{name}{BINARY_SUFFIX if binary else ''}"


def _stored(part: types.Part, filename: str) -> tuple[str, bool]:
    """The text to store for `part`, and whether it is a binary artifact's data URL."""
    if part.text is not None:
        return part.text, False
    blob = part.inline_data
    if blob is None or blob.data is None:
        msg = f"artifact {filename!r} has neither text nor inline data (a file_data part is not stored)"
        raise ValueError(msg)
    mime = blob.mime_type or "application/octet-stream"
    if mime.startswith(_TEXT_TYPES):
        try:
            return blob.data.decode("utf-8"), False
        except UnicodeDecodeError:
            pass
    return f"data:{mime};base64,{base64.b64encode(blob.data).decode('ascii')}", True


def _binary_part(encoded: str) -> types.Part | None:
    found = _DATA_URL.match(encoded.strip())
    if found is None:
        return None
    try:
        data = base64.b64decode(found.group(2), validate=True)
    except (binascii.Error, ValueError):
        return None
    return types.Part.from_bytes(data=data, mime_type=found.group(1))
