"""Governance's responders, one class per area: decisions, screens, the log and the admin surface."""
