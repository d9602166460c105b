"""The workspace's virtual filesystem: the bounded, traversal-proof file stores behind the file tools.

From the bottom up: `filesystem` (the `FileSystem` contract, `WorkspaceError`), `paths` (every
name checked as a string before any I/O), `dirfd` (fd-relative primitives that never follow a
link), `storeroot` and `filestore` (one bounded store; its `limits`, `filereads`, `filesearch` and
`filewrites`), `patterns` (glob and deadline-bound regex), `composite` (prefix-routed shared stores
behind one namespace), `conversation_stores` (which store each conversation of an owner sees) and
`file_tools` (the eight model-facing tools).

The rest of memory (the handlers, the plan store, `Workspaces`) imports from this package only.
"""

from atmosphere.memory.vfs.composite import CompositeFileSystem, parse_routes
from atmosphere.memory.vfs.conversation_stores import ConversationStores
from atmosphere.memory.vfs.dirfd import DIR_FLAGS, is_link_at, read_all, replace_atomically
from atmosphere.memory.vfs.file_tools import run_file_tool
from atmosphere.memory.vfs.filestore import DEFAULT_LIMITS, Limits, WorkspaceFileSystem
from atmosphere.memory.vfs.filesystem import Entry, FileSystem, Hit, MissingFileError, WorkspaceError
from atmosphere.memory.vfs.paths import check_conversation_id, sanitize_owner

__all__ = [
    "DEFAULT_LIMITS",
    "DIR_FLAGS",
    "CompositeFileSystem",
    "ConversationStores",
    "Entry",
    "FileSystem",
    "Hit",
    "Limits",
    "MissingFileError",
    "WorkspaceError",
    "WorkspaceFileSystem",
    "check_conversation_id",
    "is_link_at",
    "parse_routes",
    "read_all",
    "replace_atomically",
    "run_file_tool",
    "sanitize_owner",
]
