// Pins the published VerticalPodAutoscaler CRD the integration tests install
// (deploy/vpa-v1-crd-gen.yaml of this module): tests/cluster_helpers.vpa_crd reads it.
module github.com/kube-headroom/vpa

go 1.26.0

require k8s.io/autoscaler/vertical-pod-autoscaler v1.8.1
