"""The ingress service."""
