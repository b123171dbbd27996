"""The REST API under /api/v1: views, serializers, authentication, the JSON parser, error mapping."""
