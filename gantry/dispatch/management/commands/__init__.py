"""``manage.py dispatch --once`` and ``manage.py dispatcher``."""
