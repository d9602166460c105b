r"""The memory-injection safety screen: a rule-based prompt-injection classifier and breach handling.

Long-term memory facts are replayed into the system prompt of every later conversation, so a fact
that carries instructions ("ignore previous instructions ...") is a persistent prompt injection.
Every fact is screened before it is stored: `classify` runs nine regex probes (first hit wins),
and `screen_fact` applies the configured breach mode to a hit.

The probes are Atmosphere's `RuleBasedInjectionClassifier`, with these deliberate differences:

* `jailbreak-template` matches the acronyms `DAN`, `STAN` and `DUDE` only in upper case. Case-folded,
  they are ordinary names and words ("Has a brother named Dan", "Calls everyone dude"), and a
  false positive here silently drops a true fact about the user. "Developer Mode" and "do anything
  now" stay case-insensitive.
* `exfiltration-prompt` also accepts the plurals `instructions`, `secrets` and `system prompts`
  (`\binstruction\b` never matched "reveal your instructions").
* Line starts for `system-prompt-spoof` include the other line breaks Java's `(?m)^` honours
  (`\r`, U+0085, U+2028, U+2029), and the leading blank run may not cross a line break, which
  finds the same lines without the quadratic backtracking `^\s*` has on a run of blank lines
  (about 170 s for 64 Ki newlines with the original pattern under Python's `re`; milliseconds here).
* The reason excerpt has its line breaks flattened whether or not it is truncated.

Four narrow exceptions keep the probes usable on tool output (the benign corpus under
`tests/data/benign/` holds them to at most 1 % false positives; each has its own test):

* `system-prompt-spoof` skips the operators `user := ...`, `user::x`, `user >= 3`, `user >> 2`, and an
  *indented* `role:` followed by nothing or by one token (optionally then `=`, `|` or `#` and the rest
  of the line): a YAML key (`    user: postgres`) or a type annotation (`    user: User | None = None`).
  A role line at the margin, a `role>` line, or an indented `role:` followed by prose still matches.
* `role-reversal` skips "you are now subscribed / logged in / a member ..." and "you are actually right":
  notifications and replies, not a new persona.
* `exfiltration-prompt` skips `hidden` and `secret(s)` used as code identifiers (`output, hidden = rnn(x)`,
  `print(hidden.shape)`, `${{ secrets.TOKEN }}`).

Every window is bounded (`.{0,40}` style), so a scan costs a bounded amount per character; texts over
`MAX_SCREENED_CHARS` are not screened at all but classified `ERROR` (dropped unless fail-open):
screening only a prefix would let an injection hide after the cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

MAX_SCREENED_CHARS = 64 * 1024
"""Longest text `classify` screens; a memory fact is a short statement, far below this."""
INJECTED_CONFIDENCE = 0.9
SAFE_CONFIDENCE = 1.0
MAX_EXCERPT_CHARS = 80
"""Characters of the matched text quoted in a reason."""

FLAG_PREFIX = "[flagged: possible prompt injection] "
SANITIZED_PLACEHOLDER = "[memory fact was flagged as potential prompt injection and removed]"

# Java's `(?m)^` also starts a line after \r, U+0085, U+2028 and U+2029; Python's only after \n.
_LINE_START = r"(?:^|(?<=[\r\x85\u2028\u2029]))"
# Leading blanks that stay on the line (\s minus every line break).
_BLANKS = r"[^\S\n\r\x85\u2028\u2029]*"
_INDENT = r"[^\S\n\r\x85\u2028\u2029]+"
_LINE_END = r"(?=[\n\r\x85\u2028\u2029]|\Z)"
# A role word and its marker; `:=`, `::`, `>=` and `>>` are operators (Go's `user := ...`), not a turn.
_ROLE = r"(system|assistant|user)\s*"
_GT_MARKER = r">(?![>=])"
_COLON_MARKER = r":(?![:=])"
# After an indented `role:` (never `role>`), nothing, one token, or one token then `=`, `|` or `#` and anything,
# up to the end of the line: a YAML key (`    user: postgres`) or a type annotation (`    user: User | None = None`).
# It scans one line once, so the probe stays linear.
_NOT_A_KEY = r"(?!" + _BLANKS + r"(?:[^\s=|#]+" + _BLANKS + r"(?:[=|#][^\n\r\x85\u2028\u2029]*)?)?" + _LINE_END + r")"
# "You are now subscribed / logged in / a member of ..." is a notification, not a new persona.
_NOT_A_STATE = (
    r"(?!\s+(?:(?:un)?subscribed|logged|signed|registered|enrolled|(?:dis)?connected|verified|authenticated"
    r"|confirmed|ready|able|eligible|on|following|right|correct|a\s+member|part\s+of|all\s+set|set\s+up)\b)"
)
# `hidden` / `secrets` used as a code identifier: `output, hidden = rnn(x)`, `print(hidden.shape)`,
# `print(secrets[0])`, `echo "::add-mask::${{ secrets.TOKEN }}"`.
_NOT_AN_IDENTIFIER = r"(?!\s*[,=)\]]|\.\w|\[)"


class Probe(NamedTuple):
    """One named injection pattern."""

    name: str
    pattern: re.Pattern[str]


def _probe(name: str, regex: str, flags: re.RegexFlag = re.NOFLAG) -> Probe:
    return Probe(name, re.compile(regex, re.IGNORECASE | flags))


PROBES: tuple[Probe, ...] = (
    _probe(
        "instruction-override",
        r"\b(ignore|disregard|forget)\b.{0,40}\b(previous|prior|above|system)\b"
        r".{0,40}\b(instruction|prompt|rule|directive)s?\b",
    ),
    _probe("instruction-override-short", r"\b(ignore|disregard|forget)\b.{0,40}\b(instructions?|rules?|prompt)\b"),
    _probe(
        "system-prompt-spoof",
        _LINE_START
        + rf"(?:{_ROLE}(?:{_GT_MARKER}|{_COLON_MARKER})|{_INDENT}{_ROLE}(?:{_GT_MARKER}|{_COLON_MARKER}{_NOT_A_KEY}))",
        re.MULTILINE,
    ),
    _probe("role-reversal", r"\byou\s+are\s+(now|actually|secretly)\b" + _NOT_A_STATE),
    _probe("jailbreak-template", r"\b((?-i:DAN|STAN|DUDE)|developer\s+mode|do\s+anything\s+now)\b"),
    _probe(
        "exfiltration-prompt",
        r"\b(reveal|print|output|echo|show\s+me)\b.{0,40}"
        r"\b(system\s+prompts?|instructions?|(?:hidden|secrets?)\b" + _NOT_AN_IDENTIFIER + r")\b",
    ),
    _probe(
        "exfiltration-history",
        r"\b(print|output|reveal)\b.{0,40}\b(previous|prior|all)\b.{0,20}\b(messages?|turns?|conversation|history)\b",
    ),
    # The one probe where `.` crosses lines: a fenced block is multi-line by nature.
    _probe("delimiter-injection", r"```.{0,20}(system|assistant|tool)\s*[:>].{0,200}```", re.DOTALL),
    _probe("tool-call-spoof", r"\b(call|invoke|execute)\b.{0,20}\btool\b.{0,40}\b(delete|remove|drop)\b"),
)
"""The probes, in the order they are tried."""


class Verdict(Enum):
    """What the classifier concluded."""

    SAFE = "SAFE"
    INJECTED = "INJECTED"
    ERROR = "ERROR"
    """The text could not be screened; breach handling treats it as unsafe unless fail-open."""


@dataclass(frozen=True, slots=True)
class Classification:
    """A classifier decision."""

    verdict: Verdict
    confidence: float
    probe: str | None
    """The probe that matched (`None` unless INJECTED)."""
    reason: str
    """Why, for the audit log: `injection probe '<name>' matched: '<excerpt>'`; empty when SAFE."""


_SAFE = Classification(Verdict.SAFE, SAFE_CONFIDENCE, None, "")


def _excerpt(matched: str) -> str:
    flat = re.sub(r"\r\n|[\n\r\x85\u2028\u2029]", " ", matched)
    return flat if len(flat) <= MAX_EXCERPT_CHARS else flat[:MAX_EXCERPT_CHARS] + "…"


def classify(text: str, *, max_chars: int = MAX_SCREENED_CHARS) -> Classification:
    """Screen `text` with the rule-based probes; the first (in `PROBES` order) that matches wins.

    A text longer than `max_chars` is not screened but classified ERROR (the tool-output and
    document screens raise the bound to 256 KiB; memory facts keep `MAX_SCREENED_CHARS`).
    """
    if len(text) > max_chars:
        reason = f"text of {len(text)} characters exceeds the {max_chars}-character screening limit"
        return Classification(Verdict.ERROR, 0.0, None, reason)
    if not text.strip():
        return _SAFE
    for probe in PROBES:
        match = probe.pattern.search(text)
        if match is not None:
            reason = f"injection probe '{probe.name}' matched: '{_excerpt(match.group())}'"
            return Classification(Verdict.INJECTED, INJECTED_CONFIDENCE, probe.name, reason)
    return _SAFE


class Breach(Enum):
    """What happens to a fact classified INJECTED (`org.atmosphere.ai.memory.safety.on-breach`)."""

    DROP = "DROP"
    """Discard the fact (the default)."""
    FLAG = "FLAG"
    """Store it with `FLAG_PREFIX`, so a reader of the prompt sees the warning."""
    SANITIZE = "SANITIZE"
    """Store `SANITIZED_PLACEHOLDER` in its place."""


@dataclass(frozen=True, slots=True)
class ScreenOutcome:
    """The decision about one fact on its way into long-term memory."""

    store: bool
    text: str | None
    """What to store (`None` when `store` is false)."""
    classification: Classification

    @property
    def audited(self) -> bool:
        """Whether this decision belongs in the audit log (every non-safe one does)."""
        return self.classification.verdict is not Verdict.SAFE


def screen_fact(text: str, breach: Breach = Breach.DROP, *, fail_open: bool = False) -> ScreenOutcome:
    """Screen a fact before it is stored.

    SAFE stores the fact as it is; INJECTED drops, flags or sanitizes it per `breach`; a classifier
    ERROR drops it unless `fail_open` (fail-closed by default: an unscreened fact is not trusted).
    """
    classification = classify(text)
    if classification.verdict is Verdict.SAFE:
        return ScreenOutcome(True, text, classification)
    if classification.verdict is Verdict.ERROR:
        return ScreenOutcome(fail_open, text if fail_open else None, classification)
    if breach is Breach.FLAG:
        return ScreenOutcome(True, FLAG_PREFIX + text, classification)
    if breach is Breach.SANITIZE:
        return ScreenOutcome(True, SANITIZED_PLACEHOLDER, classification)
    return ScreenOutcome(False, None, classification)


__all__ = [
    "FLAG_PREFIX",
    "INJECTED_CONFIDENCE",
    "MAX_EXCERPT_CHARS",
    "MAX_SCREENED_CHARS",
    "PROBES",
    "SAFE_CONFIDENCE",
    "SANITIZED_PLACEHOLDER",
    "Breach",
    "Classification",
    "Probe",
    "ScreenOutcome",
    "Verdict",
    "classify",
    "screen_fact",
]
