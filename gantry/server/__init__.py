"""The production server process (``gunicorn gantry.asgi``, uvicorn's worker): docs/operations.md, "Serving".

- ``asgi``: the ASGI application: the long poll parked on the event loop, the
  runner's hot calls through the fast lane, every other request through the
  Django WSGI app in threads.
- ``lane``: the fast lane, which answers the runner's hot calls straight from
  the ASGI scope; ``facts``: what it derives from Django at start-up (routes,
  the middleware's headers, the host check); ``lanedb``: its asyncio
  connection pool.
- ``asyncpoll``: parked long polls on the event loop (the threaded wait, and
  the LISTEN listener every server mode shares, stay in gantry.dispatch.longpoll).

Importing this package imports none of them: gantry.api's PollView reads the
Deferred of ``asyncpoll`` under every server mode, without the ASGI app.
"""
