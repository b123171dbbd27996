"""The domain: models, the state machine's services, validation, credentials, the error registry, the admin."""
