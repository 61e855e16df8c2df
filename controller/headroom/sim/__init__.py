"""What simulates: the kubelet stand-in that writes pod status where no real node runs
(scale tests, the shared integration control plane, and the multi-node part of
`headroom demo`)."""
