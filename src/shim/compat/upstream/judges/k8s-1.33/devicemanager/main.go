// The kubelet's device manager of k8s.io/kubernetes v1.33, driven over stdin and
// stdout (../../harness), with the signatures of releases up to 1.34.
package main

import (
	"os"

	"devshim.example/judges/harness"
	"devshim.example/judges/harness/upto134"
)

func main() { os.Exit(harness.Main(upto134.Release{})) }
