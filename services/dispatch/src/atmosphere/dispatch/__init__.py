"""The dispatch service."""
