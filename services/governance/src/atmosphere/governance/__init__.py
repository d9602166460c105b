"""The governance service."""
