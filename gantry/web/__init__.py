"""The pages (queue, runs, runner groups, login), the ops endpoints and request middleware."""
