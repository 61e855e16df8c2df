// Pins the published CRDs of other projects that the tests install: the
// VerticalPodAutoscaler (deploy/vpa-v1-crd-gen.yaml) and the Prometheus Operator's
// ServiceMonitor and PrometheusRule (example/prometheus-operator-crd/), which the chart's
// production values create. tests/helpers/cluster_helpers.install_published_crd reads them.
module github.com/kube-headroom/crds-published

go 1.26.0

require (
	github.com/prometheus-operator/prometheus-operator v0.90.1
	k8s.io/autoscaler/vertical-pod-autoscaler v1.8.1
)
