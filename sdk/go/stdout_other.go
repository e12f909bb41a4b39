//go:build !unix

package driver

import "os"

// ownStdout keeps stdout for the protocol; where descriptors cannot be
// redirected, only os.Stdout is pointed at stderr.
func ownStdout() (*os.File, error) {
	out := os.Stdout
	os.Stdout = os.Stderr
	return out, nil
}
