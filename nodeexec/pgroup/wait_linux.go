//go:build linux

package pgroup

import (
	"syscall"
	"unsafe"
)

const supported = true

const pPID = 1 // idtype_t P_PID

// WaitExited blocks until the child pid has exited, without reaping it:
// its zombie keeps the PID, and so its group's number, reserved.
func WaitExited(pid int) error {
	var info [128]byte // siginfo_t; not needed, but the kernel writes it
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return errno
		}
	}
}
