"""Dispatch: the poll's claim, the throttle, the long poll, the queue's reasons, the backend dispatcher."""
