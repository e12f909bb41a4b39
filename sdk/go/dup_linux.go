//go:build linux

package driver

import "syscall"

// dup2 as Linux has it on every architecture (arm64 has no dup2 system call).
func dup2(from, to int) error { return syscall.Dup3(from, to, 0) }
