"""What governance's responders share: the bounds of a request's fields, the principal's name, the time.

Ids and names longer than `MAX_FIELD_CHARS` are refused (`governance.bad_request`) before
anything is decided or logged.
"""

from __future__ import annotations

import time

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.governance.errors import GovernanceBadRequestError

MAX_FIELD_CHARS = 1024
"""The longest id or name accepted (run ids, agent and tool names, the principal's fields)."""
ITEM_OVERHEAD = 16
"""Protobuf framing of one screened fact or decision record in a reply."""


def check_fields(**fields: str) -> None:
    """Refuse a request with a field longer than `MAX_FIELD_CHARS` (named by its keyword)."""
    for name, value in fields.items():
        if len(value) > MAX_FIELD_CHARS:
            msg = f"{name} is {len(value)} characters; the limit is {MAX_FIELD_CHARS}"
            raise GovernanceBadRequestError(msg)


def check_principal(principal: Principal) -> None:
    """Refuse a principal with a field longer than `MAX_FIELD_CHARS`."""
    check_fields(
        principal_user_id=principal.user_id, principal_name=principal.name, principal_auth=principal.auth_method
    )


def principal_name(principal: Principal) -> str:
    """Who a decision is logged for."""
    return principal.user_id or principal.name or principal.auth_method or "anonymous"


def now() -> Timestamp:
    """This moment, to the millisecond (as decisions are stamped)."""
    stamp = Timestamp()
    stamp.FromMilliseconds(int(time.time() * 1000))
    return stamp
