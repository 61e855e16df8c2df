// The Argo CD the tests run: the multicall binary cut down to the three roles a GitOps
// sync needs (the application controller, the repo-server, and git's askpass helper the
// repo-server calls). It picks its role from argv[0] or ARGOCD_BINARY_NAME, as Argo CD's
// own cmd/main.go does. tests/argocd/build.sh copies it into the pinned Argo CD module as
// cmd/headroom-testbed/main.go and builds it there; it is not built on its own.
//
// Unlike Argo CD's main it does not call grpc.DisableSRVLookups(): that panics when the
// grpclb balancer is not linked in, and the argocd-server code that links it is left out.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	name := filepath.Base(os.Args[0])
	if v := os.Getenv("ARGOCD_BINARY_NAME"); v != "" {
		name = v
	}
	var command *cobra.Command
	switch name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	case common.CommandGitAskPass:
		command = gitaskpass.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "%s: run as %s, %s or %s\n", name, common.CommandApplicationController,
			common.CommandRepoServer, common.CommandGitAskPass)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
