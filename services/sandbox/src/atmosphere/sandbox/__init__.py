"""The sandbox service."""
