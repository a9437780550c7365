"""API keys with limits: stored (store.py), checked and counted (access.py), managed with
`python -m service.keys` (__main__.py)."""
