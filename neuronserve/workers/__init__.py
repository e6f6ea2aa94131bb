"""The native engine: the front hands each core group's worker process its requests over
a unix socket in a private folder, with no server in between (engine.py)."""
