"""``manage.py reap``."""
