"""Memory's responders, one class per area: history, facts, the harness tools, workspaces."""
