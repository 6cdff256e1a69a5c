//go:build linux

package pgroup

import (
	"syscall"
	"unsafe"
)

const supported = true

// dieWithParent has the kernel SIGKILL the command when the agent dies (a
// crash, SIGKILL): a check that hangs must not outlive the agent that
// would have timed it out. The signal comes when the thread that started
// the command exits (Run holds it until the command is reaped), and not
// when the command execs a set-ID program or one with file capabilities.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

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
