"""The local cluster the tests, the benchmarks and `make demo` run on — test
infrastructure, never shipped: a real etcd and kube-apiserver (`controlplane`), and on
request a real node (`node`: containerd, runc, CNI and the kubelet on this machine's
cgroups), all built from pinned Go modules and Debian packages; the controller image
(`controller_image`); Flux and Prometheus; what they change on the host (`host`); the
simulated kubelet (`sim_kubelet`, the one thing here that simulates); and the demo
(`demo`). Nothing under controller/ imports it (tests/unit/test_package.py holds that)."""
