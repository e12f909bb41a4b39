// The upstream kubelet of this release, whole, for the real-node fixture (shim.compat.realnode):
// the same command the release's cmd/kubelet builds, linked from k8s.io/kubernetes at the
// version go.mod pins, so the node runs exactly that release's code.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand()))
}
