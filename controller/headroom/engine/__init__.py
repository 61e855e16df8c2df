"""The work queue, the node reconciler, backoff, and the loop that runs them."""
