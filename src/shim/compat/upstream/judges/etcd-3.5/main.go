// etcd's server at v3.5.21, the release a Kubernetes release's go.mod names for its etcd client,
// for the control-plane fixture (shim.compat.realnode.controlplane). This wrapper module exists
// because `go install` refuses etcd's own modules, whose go.mod files carry replace lines.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
