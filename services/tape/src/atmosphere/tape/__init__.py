"""The tape service."""
