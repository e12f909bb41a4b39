//go:build unix

package driver

import (
	"os"
	"syscall"
)

// ownStdout keeps a private copy of stdout for the protocol and points file
// descriptor 1 at stderr, so nothing else in the process can write a line
// devshim would read as a message.
func ownStdout() (*os.File, error) {
	private, err := syscall.Dup(1)
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(private) // a child process must not inherit the protocol's end
	if err := dup2(2, 1); err != nil {
		syscall.Close(private)
		return nil, err
	}
	os.Stdout = os.Stderr
	return os.NewFile(uintptr(private), "devshim-protocol"), nil
}
