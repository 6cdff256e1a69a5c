//go:build !linux && !(freebsd && (amd64 || arm64 || riscv64))

package pgroup

import (
	"errors"
	"syscall"
)

// supported is false: Run needs to wait for a child without reaping it.
const supported = false

func WaitExited(pid int) error { return errors.ErrUnsupported }

func dieWithParent(*syscall.SysProcAttr) {}
