"""The `atmosphere` command: the local dev stack."""
