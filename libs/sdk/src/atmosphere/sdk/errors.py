"""Errors of the SDK.

SdkError
└── UserError     the SDK was used wrongly; raised at import/registration, not mid-run
"""

from __future__ import annotations


class SdkError(Exception):
    """Base class of the SDK's errors."""


class UserError(SdkError):
    """The SDK was used wrongly (a bad decorator, a missing `@prompt`, a duplicate name)."""
