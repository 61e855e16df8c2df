"""The local cluster the tests, the benchmarks and `headroom demo` run on: a real etcd and
kube-apiserver (`controlplane`), and on request a real node (`node`: containerd, runc,
CNI and the kubelet on this machine's cgroups), all built from pinned Go modules and
Debian packages. Nothing here simulates; `headroom.sim` holds what does."""
