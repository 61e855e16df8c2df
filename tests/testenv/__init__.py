"""A real kube-apiserver + etcd for the tests (SPEC §14), and a simulated kubelet."""
