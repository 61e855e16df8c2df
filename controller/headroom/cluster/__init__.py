"""Talking to the API server: client, list+watch, the cache, and writes."""
