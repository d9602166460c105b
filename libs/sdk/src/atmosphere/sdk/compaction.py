"""Conversation-memory compaction: keep a conversation's history within `max_messages`.

Three strategies, as in Atmosphere's `org.atmosphere.ai.compaction` init-param:

* `sliding-window` (the default, also for unset and unknown names): drop the oldest non-system
  message until the history fits; when only system messages remain, drop the oldest.
* `summarizing`: keep the system messages and a recent window verbatim, and replace everything
  older with ONE system message: the line `[Conversation summary of N earlier messages]`, then the summary.
  The summary text comes from the caller (a model, see `summary_prompt`) or `local_summary`.
  A previous summary message is folded into the next one (its N accumulates), so however long
  the conversation, the history holds at most one summary and never more than `max_messages`.
* `token-window`: keep the system messages, then the newest messages that fit both the model's
  context window (`MODEL_WINDOWS`, tokens estimated as chars/4) and the message budget.

Everything here is pure: no I/O, no model calls.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, get_args

from atmosphere.sdk._request import ChatMessage

_log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Strategy names
# --------------------------------------------------------------------------------------------

Strategy = Literal["sliding-window", "summarizing", "token-window"]
SLIDING_WINDOW: Final = "sliding-window"
SUMMARIZING: Final = "summarizing"
TOKEN_WINDOW: Final = "token-window"  # noqa: S105  (a strategy name, not a credential)
STRATEGIES: Final[tuple[Strategy, ...]] = get_args(Strategy)
DEFAULT_STRATEGY: Final = SLIDING_WINDOW

_warned_strategies: set[str] = set()


def parse_strategy(text: str | None) -> Strategy:
    """The strategy named by `text` (case, surrounding blanks and `_` for `-` tolerated).

    Unset or blank means `sliding-window`; an unknown name also means `sliding-window`, with a
    warning logged once per distinct name.
    """
    name = (text or "").strip().lower().replace("_", "-")
    if not name:
        return DEFAULT_STRATEGY
    for strategy in STRATEGIES:
        if name == strategy:
            return strategy
    if name not in _warned_strategies:
        _warned_strategies.add(name)
        _log.warning("unknown compaction strategy %r, using %s", text, DEFAULT_STRATEGY)
    return DEFAULT_STRATEGY


def _check_max(max_messages: int) -> None:
    if max_messages < 1:
        msg = f"max_messages must be at least 1, got {max_messages}"
        raise ValueError(msg)


# --------------------------------------------------------------------------------------------
# Sliding window
# --------------------------------------------------------------------------------------------


def sliding_window_keep(roles: Sequence[str], max_messages: int) -> list[int]:
    """The indices (ascending) that `sliding_window` keeps, from the messages' roles alone."""
    _check_max(max_messages)
    excess = len(roles) - max_messages
    if excess <= 0:
        return list(range(len(roles)))
    dropped: set[int] = set()
    for index, role in enumerate(roles):
        if len(dropped) == excess:
            break
        if role != "system":
            dropped.add(index)
    # Only system messages remain and there are still too many: drop the oldest of them.
    for index in range(len(roles)):
        if len(dropped) == excess:
            break
        dropped.add(index)
    return [index for index in range(len(roles)) if index not in dropped]


def sliding_window(messages: Sequence[ChatMessage], max_messages: int) -> list[ChatMessage]:
    """Drop the oldest non-system message until at most `max_messages` remain.

    When only system messages remain and there are still too many, the oldest ones go.
    """
    return [messages[i] for i in sliding_window_keep([m.role for m in messages], max_messages)]


# --------------------------------------------------------------------------------------------
# Summarizing
# --------------------------------------------------------------------------------------------

DEFAULT_RECENT_WINDOW: Final = 6
LOCAL_LINE_CHARS: Final = 100
"""Each message of a local summary keeps this many characters of its content."""
LOCAL_SUMMARY_MAX_CHARS: Final = 4_000
"""A local summary keeps its newest lines within this size (older lines fall off)."""
MAX_SUMMARY_CHARS: Final = 16_000
"""A summary written by a model is cut to this size before it is stored."""
PROMPT_MESSAGE_CHARS: Final = 2_000
"""Each message quoted in `summary_prompt` keeps this many characters."""

_SUMMARY_HEADER = re.compile(r"\[Conversation summary of (\d+) earlier messages\]\n?")

SUMMARY_SYSTEM_PROMPT: Final = (
    "You are a conversation summarizer. You condense a conversation between a user and an "
    "assistant into a short, factual summary that lets the assistant continue the conversation."
)


def summary_header(count: int) -> str:
    """The first line of a summary message replacing `count` earlier messages."""
    return f"[Conversation summary of {count} earlier messages]"


def summary_of(message: ChatMessage) -> tuple[int, str] | None:
    """`(N, summary text)` if `message` is a summary message written by this module, else None."""
    if message.role != "system":
        return None
    match = _SUMMARY_HEADER.match(message.content)
    if match is None:
        return None
    return int(match.group(1)), message.content[match.end() :]


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """How a summarizing compaction splits a history that is over its bound."""

    system: tuple[ChatMessage, ...]
    """System messages kept verbatim, in order (previous summaries excluded)."""
    old: tuple[ChatMessage, ...]
    """What the summary replaces, oldest first: any previous summary message, then the evicted messages."""
    recent: tuple[ChatMessage, ...]
    """The newest non-system messages, kept verbatim."""
    summarized_count: int
    """N of the new summary: earlier summaries' N plus the messages evicted now."""


def split_for_summary(
    messages: Sequence[ChatMessage], max_messages: int, recent_window: int = DEFAULT_RECENT_WINDOW
) -> SummaryPlan | None:
    """Plan a summarizing compaction, or None when there is nothing a summary can do.

    None means either the history already fits, or the system messages leave no room for a
    summary plus one recent message (max - #system - 1 < 1); `compact` then falls back to the
    sliding window. Otherwise recentBudget = max - #system - 1 and the recent window is
    min(`recent_window`, recentBudget) messages, so the compacted history holds at most
    `max_messages` and exactly one summary.
    """
    _check_max(max_messages)
    if len(messages) <= max_messages:
        return None
    system: list[ChatMessage] = []
    previous: list[ChatMessage] = []
    conversation: list[ChatMessage] = []
    for message in messages:
        if summary_of(message) is not None:
            previous.append(message)
        elif message.role == "system":
            system.append(message)
        else:
            conversation.append(message)
    recent_budget = max_messages - len(system) - 1
    if recent_budget < 1:
        return None
    window = min(max(recent_window, 1), recent_budget)
    cut = max(len(conversation) - window, 0)
    evicted = conversation[:cut]
    earlier = sum(count for count, _ in (summary_of(m) or (0, "") for m in previous))
    return SummaryPlan(
        system=tuple(system),
        old=(*previous, *evicted),
        recent=tuple(conversation[cut:]),
        summarized_count=earlier + len(evicted),
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def local_summary(old: Sequence[ChatMessage]) -> str:
    """A summary without a model: one line `role: content` per message, content cut at 100 chars + `...`.

    Line breaks inside a message become spaces, so each message is one line. A previous summary's
    lines are carried over as they are; the newest lines are kept within `LOCAL_SUMMARY_MAX_CHARS`.
    """
    lines: list[str] = []
    for message in old:
        previous = summary_of(message)
        if previous is not None:
            lines.extend(line for line in previous[1].splitlines() if line.strip())
        else:
            lines.append(f"{message.role}: {_clip(_one_line(message.content), LOCAL_LINE_CHARS)}")
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line) + 1
        if size > LOCAL_SUMMARY_MAX_CHARS and kept:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


def summary_prompt(old: Sequence[ChatMessage]) -> str:
    """The user prompt asking a model (with `SUMMARY_SYSTEM_PROMPT`) to summarize `old`.

    A previous summary is given as such so the model merges it; each quoted message is cut at
    `PROMPT_MESSAGE_CHARS` so the prompt stays bounded.
    """
    earlier: list[str] = []
    lines: list[str] = []
    for message in old:
        previous = summary_of(message)
        if previous is not None:
            earlier.append(previous[1].strip())
        else:
            lines.append(f"{message.role}: {_clip(message.content, PROMPT_MESSAGE_CHARS)}")
    parts = [
        "Summarize the conversation below so it can be continued without it. Keep the facts, "
        "decisions, names and open questions; drop greetings and filler. Respond with the summary "
        "only: no preamble, no commentary."
    ]
    if earlier:
        parts.append("Summary of the conversation before it (merge it into yours):\n" + "\n".join(earlier))
    parts.append("Conversation:\n" + "\n".join(lines))
    return "\n\n".join(parts)


def apply_summary(plan: SummaryPlan, summary_text: str | None) -> list[ChatMessage]:
    """The compacted history: system messages, ONE summary message, then the recent window.

    A blank `summary_text` (the model failed or answered nothing) falls back to `local_summary`.
    """
    text = (summary_text or "").strip() or local_summary(plan.old)
    if len(text) > MAX_SUMMARY_CHARS:
        text = text[:MAX_SUMMARY_CHARS] + "..."
    summary = ChatMessage("system", f"{summary_header(plan.summarized_count)}\n{text}")
    return [*plan.system, summary, *plan.recent]


# --------------------------------------------------------------------------------------------
# Token window
# --------------------------------------------------------------------------------------------

DEFAULT_WINDOW: Final = 4_000
MODEL_WINDOWS: Final[dict[str, int]] = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "llama3.1": 128_000,
    "llama3.2": 128_000,
    "o3": 200_000,
    "gemini-2.5-flash": 1_000_000,
    "gemini-2.5-pro": 1_000_000,
}
"""Context windows in tokens, by model-name prefix."""

_NAME_SEPARATORS = "-:.@_ "


def model_window(model: str | None) -> int:
    """The context window of `model` in tokens, `DEFAULT_WINDOW` (4000) when unknown.

    Matching ignores case and a provider prefix (`openai/gpt-4o`), and takes the longest catalog
    name that is the model name or begins it followed by a separator: `gpt-4o-mini-2024-07-18`
    is `gpt-4o-mini`, `llama3.1:8b` is `llama3.1`, but `o3x` is unknown.
    """
    name = (model or "").strip().lower().rsplit("/", 1)[-1]
    best = ""
    for key in MODEL_WINDOWS:
        matches = name == key or (name.startswith(key) and name[len(key)] in _NAME_SEPARATORS)
        if matches and len(key) > len(best):
            best = key
    return MODEL_WINDOWS[best] if best else DEFAULT_WINDOW


def estimate_tokens(message: ChatMessage) -> int:
    """Tokens of `message`, estimated as characters / 4 (at least 1)."""
    return _tokens(len(message.content))


def _tokens(chars: int) -> int:
    return max(1, chars // 4)


def token_window_keep(roles: Sequence[str], chars: Sequence[int], max_messages: int, window: int) -> list[int]:
    """The indices (ascending) that `token_window` keeps, from roles and content lengths alone."""
    _check_max(max_messages)
    system = [i for i, role in enumerate(roles) if role == "system"]
    if len(system) >= max_messages:
        # No room for anything else: the sliding window's rule for system messages applies.
        return system[len(system) - max_messages :]
    token_budget = window - sum(_tokens(chars[i]) for i in system)
    message_budget = max_messages - len(system)
    kept = list(system)
    for index in reversed(range(len(roles))):
        if roles[index] == "system":
            continue
        cost = _tokens(chars[index])
        if message_budget == 0 or cost > token_budget:
            break  # newest-first and contiguous: nothing older than a message that did not fit
        kept.append(index)
        message_budget -= 1
        token_budget -= cost
    return sorted(kept)


def token_window(messages: Sequence[ChatMessage], max_messages: int, model: str | None) -> list[ChatMessage]:
    """Keep the system messages, then the newest messages within the model's window and `max_messages`.

    A message that does not fit ends the window, so what is kept is the most recent stretch of
    the conversation, in chronological order.
    """
    keep = token_window_keep(
        [m.role for m in messages], [len(m.content) for m in messages], max_messages, model_window(model)
    )
    return [messages[i] for i in keep]


# --------------------------------------------------------------------------------------------
# One entry point
# --------------------------------------------------------------------------------------------


def compact(
    messages: Sequence[ChatMessage],
    *,
    strategy: str,
    max_messages: int,
    model: str | None = None,
    summary: str | None = None,
    recent_window: int = DEFAULT_RECENT_WINDOW,
) -> list[ChatMessage]:
    """Compact `messages` with `strategy` (parsed with `parse_strategy`).

    For `summarizing`, `summary` is the model-written summary of this history's plan (see
    `split_for_summary`, `summary_prompt`); without it `local_summary` is used. When no summary
    fits (too many system messages), the sliding window applies.
    """
    match parse_strategy(strategy):
        case "token-window":
            return token_window(messages, max_messages, model)
        case "summarizing":
            plan = split_for_summary(messages, max_messages, recent_window)
            if plan is None:
                return sliding_window(messages, max_messages)
            return apply_summary(plan, summary)
        case _:
            return sliding_window(messages, max_messages)


# --------------------------------------------------------------------------------------------
# Replacing a stored history
# --------------------------------------------------------------------------------------------


class RoleAndContent(Protocol):
    """A message as any side holds it: this module's `ChatMessage`, or memory's wire `ChatMessage`."""

    @property
    def role(self) -> str:
        """`system`, `user`, `assistant` or `tool`."""
        ...

    @property
    def content(self) -> str:
        """The message's text."""
        ...


def history_digest(messages: Iterable[RoleAndContent]) -> str:
    """The hex SHA-256 that guards the replacement of a stored history by its compacted form.

    Dispatch sends it (`ReplaceHistoryRequest.base_sha256`) for the history it compacted, and
    memory compares it with the stored one, so both must compute it the same way: role, NUL,
    content, NUL for each message, UTF-8 (a lone surrogate as its surrogate-pass bytes).
    """
    digest = hashlib.sha256()
    for message in messages:
        digest.update(message.role.encode("utf-8", errors="surrogatepass") + b"\0")
        digest.update(message.content.encode("utf-8", errors="surrogatepass") + b"\0")
    return digest.hexdigest()
