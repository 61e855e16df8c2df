"""kube-headroom: CPU limits that follow each node's unbooked CPU."""

__version__ = "0.1.0"
