"""The operators' entry point, ``gunicorn gantry.asgi`` (Dockerfile, gunicorn.conf.py, dev.py, compose, deploy/,
docs): it stays so every deployment's command keeps working; the application lives in gantry.server.asgi."""

from gantry.server.asgi import application as application
