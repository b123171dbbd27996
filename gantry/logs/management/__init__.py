"""Management commands of the logs app."""
