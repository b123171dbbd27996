"""Gantry's client side: the API client, the coordinator daemon and the ephemeral runner.

Nothing here imports Django, nor anything under ``gantry``: these programs run
on runner hosts that have only this repository (and the standard library)
installed. What they share with the server and the launchers (the protocol's
values, the JSON log line, /proc) is the ``gantry_wire`` package beside this
one. See docs/runners.md.
"""
