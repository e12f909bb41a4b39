// The upstream kube-scheduler of this release, for the connected node (shim.compat.realnode.scheduler):
// the release's own cmd/kube-scheduler command, linked from k8s.io/kubernetes at the version go.mod
// pins, so the claims of the node's pods are allocated by exactly that release's DRA plugin.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
