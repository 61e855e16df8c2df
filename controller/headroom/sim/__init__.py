"""What simulates: the kubelet stand-in that writes pod status where no real node runs
(scale tests and `headroom demo` on machines that cannot run a real node), and the demo."""
