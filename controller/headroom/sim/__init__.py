"""Snapshots of a cluster, and (later) the in-memory cluster built from them."""
