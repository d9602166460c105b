"""Apps that exist only for the end-to-end tests."""
