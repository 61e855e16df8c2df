"""The work queue, the node reconciler and what its pass hands on (status annotations,
resends of resizes the kubelet never applied, wave events), backoff, the status of our
objects, and the controller that runs them."""
