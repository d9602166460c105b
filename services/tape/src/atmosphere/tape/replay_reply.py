"""A replayed tree as one `ReplayResponse` that fits in one bus message.

A run too large for its room is shrunk fairly: of its input, output and tool calls, the parts
smaller than an equal share keep all they have and the larger ones split what is left. The
input drops its oldest history first (the leading system prompt and the user's message stay),
then its contents are cut; the output is cut; the tool calls have their arguments cut, then the
last ones are dropped. Whatever is cut ends with a marker naming its whole size (`clip`), and
the run says what is missing (`input_omitted`, `tools_omitted`, `clipped`).

The root has the whole budget when it has no children, else half of it at most; the children
then share the rest, oldest first, and those that no longer fit are counted in
`children_omitted`.
"""

from __future__ import annotations

from atmosphere.bus.sizes import clip, utf8_len
from atmosphere.contracts.tape.v1.tape_pb2 import ReplayedMessage, ReplayedRun, ReplayedTool, ReplayResponse
from atmosphere.tape.replay import Replay, ReplayTree

_ITEM_OVERHEAD = 16
"""Protobuf framing of one message, run or tool in a reply."""
MIN_CHILD_BYTES = 4096
"""The smallest room a child is given: below it, the children left are omitted instead."""


def replayed_run(replay: Replay) -> ReplayedRun:
    """`replay` as sent, whole."""
    run = replay.run
    return ReplayedRun(
        run_id=run.run_id,
        parent_run_id=run.parent_run_id,
        status=run.status,
        model=run.model,
        runtime=run.runtime,
        endpoint=run.endpoint,
        started_at=run.started_at,
        ended_at=run.ended_at or 0,
        input=[ReplayedMessage(role=role, content=content) for role, content in replay.input],
        output=replay.output,
        tools=[ReplayedTool(name=t.name, arguments=t.arguments) for t in replay.tools],
    )


def _shares(sizes: dict[str, int], room: int) -> dict[str, int]:
    """Each part's allowance of `room`: the small ones whole, the large ones an equal split of the rest."""
    allowance: dict[str, int] = {}
    left = max(0, room)
    ordered = sorted(sizes.items(), key=lambda item: item[1])
    for i, (name, size) in enumerate(ordered):
        allowance[name] = min(size, left // (len(ordered) - i))
        left -= allowance[name]
    return allowance


def _input_size(run: ReplayedRun) -> int:
    return sum(m.ByteSize() + _ITEM_OVERHEAD for m in run.input)


def _tools_size(run: ReplayedRun) -> int:
    return sum(t.ByteSize() + _ITEM_OVERHEAD for t in run.tools)


def _fit_output(run: ReplayedRun, allowance: int) -> None:
    if utf8_len(run.output) > allowance:
        run.output = clip(run.output, max(0, allowance - _ITEM_OVERHEAD), "the output")
        run.clipped = True


def _fit_tools(run: ReplayedRun, allowance: int) -> None:
    if _tools_size(run) <= allowance:
        return
    share = max(64, allowance // max(1, len(run.tools)) - _ITEM_OVERHEAD - 64)
    for tool in run.tools:
        if utf8_len(tool.arguments) > share:
            tool.arguments = clip(tool.arguments, share, "the arguments")
            run.clipped = True
    sizes = [t.ByteSize() + _ITEM_OVERHEAD for t in run.tools]
    kept, total = 0, 0
    while kept < len(sizes) and total + sizes[kept] <= allowance:
        total += sizes[kept]
        kept += 1
    run.tools_omitted += len(sizes) - kept
    del run.tools[kept:]


def _fit_input(run: ReplayedRun, allowance: int) -> None:
    """Drop the oldest history (one slice, sized once), then cut what is left evenly."""
    first_history = 1 if run.input and run.input[0].role == "system" else 0
    sizes = [m.ByteSize() + _ITEM_OVERHEAD for m in run.input]
    total = sum(sizes)
    drop = 0
    while total > allowance and first_history + drop < len(sizes) - 1:
        total -= sizes[first_history + drop]
        drop += 1
    if drop:
        del run.input[first_history : first_history + drop]
        run.input_omitted += drop
    if total > allowance:
        share = max(64, allowance // max(1, len(run.input)) - _ITEM_OVERHEAD)
        for message in run.input:
            if utf8_len(message.content) > share:
                message.content = clip(message.content, share, "the message")
                run.clipped = True


def _last_resort(run: ReplayedRun, limit: int) -> None:
    """Shrink until `run` fits whatever its ids take: what is left of its parts goes, tools first."""
    while run.ByteSize() > limit and (run.tools or run.input or run.output):
        if run.tools:
            run.tools_omitted += len(run.tools)
            del run.tools[:]
        elif run.output:
            run.output = ""
            run.clipped = True
        else:
            run.input_omitted += len(run.input)
            del run.input[:]


def fit_run(run: ReplayedRun, limit: int) -> None:
    """Shrink `run` in place until it takes at most `limit` bytes."""
    if run.ByteSize() <= limit:
        return
    bare = ReplayedRun()
    bare.CopyFrom(run)
    del bare.input[:], bare.tools[:]
    bare.output = ""
    sizes = {"input": _input_size(run), "output": utf8_len(run.output) + _ITEM_OVERHEAD, "tools": _tools_size(run)}
    allowance = _shares(sizes, limit - bare.ByteSize() - 3 * _ITEM_OVERHEAD)
    _fit_tools(run, allowance["tools"])
    _fit_input(run, allowance["input"])
    _fit_output(run, allowance["output"])
    _last_resort(run, limit)


def replay_response(tree: ReplayTree, budget: int) -> ReplayResponse:
    """`tree` as one reply of at most `budget` bytes."""
    response = ReplayResponse(run_id=tree.root.run.run_id, present=True, run_count=1 + tree.child_count)
    root = replayed_run(tree.root)
    fit_run(root, (budget // 2 if tree.children else budget) - response.ByteSize() - _ITEM_OVERHEAD)
    response.root.CopyFrom(root)
    room = budget - response.ByteSize()
    for i, child in enumerate(tree.children):
        message = replayed_run(child)
        share = room // (len(tree.children) - i) - _ITEM_OVERHEAD
        if message.ByteSize() > share:
            # An even share of what is left, but never so little that the child says nothing.
            fit_run(message, max(share, min(MIN_CHILD_BYTES, room - _ITEM_OVERHEAD)))
        size = message.ByteSize() + _ITEM_OVERHEAD
        if size > room:
            break
        response.children.append(message)
        room -= size
    response.children_omitted = tree.child_count - len(response.children)
    return response
