"""Gantry's client side: the API client, the coordinator daemon and the ephemeral runner.

Nothing here imports Django: these programs run on runner hosts that have
only this repository (and the standard library) installed. See docs/runners.md.
"""
