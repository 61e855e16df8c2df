// Command kube-apiserver is the upstream API server, unchanged, built from the pinned
// k8s.io/kubernetes module so the tests need no container image or release download.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
