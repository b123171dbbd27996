"""Management commands of the reapers app."""
