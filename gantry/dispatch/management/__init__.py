"""Management commands of the dispatch app."""
