"""The failure-window reapers (docs/reapers.md)."""
