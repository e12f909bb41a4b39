// Package containerd names, in go.mod, the containerd release the real node runs when it needs
// CDI (shim.compat.realnode): go.mod's tool lines are the programs built from it (containerd, its
// runc shim and ctr, each the release's own command, unchanged), go.sum pins everything. Debian
// bookworm's containerd 1.6 has no CDI; from 2.0 CDI is always on and resolves the CDI devices
// the kubelet hands over for a DRA claim from the spec directories the configuration names.
//
// This package holds no code: it is here so that `go vet ./...` finds a package in the module.
package containerd
