// The upstream kube-apiserver of this release, for the control-plane fixture
// (shim.compat.realnode.controlplane): the release's own cmd/kube-apiserver command, linked from
// k8s.io/kubernetes at the version go.mod pins, so the tests talk to exactly that release's API.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
