"""``manage.py demo_setup``, ``error_codes``, ``rotate_secrets``."""
