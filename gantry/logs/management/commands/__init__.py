"""``manage.py create_log_bucket``."""
