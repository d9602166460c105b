"""Sample Atmosphere apps."""
