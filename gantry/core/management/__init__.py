"""Management commands of the core app."""
