// Command kube-proxy is the upstream one, unchanged, built from the pinned
// k8s.io/kubernetes module (its own proxy.go less the license header), for the real test
// cluster's Service network (the controller's pods reach the API server at its ClusterIP).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	command := app.NewProxyCommand()
	code := cli.Run(command)
	os.Exit(code)
}
