//go:build freebsd && (amd64 || arm64 || riscv64)

package pgroup

import "syscall"

const supported = true

// dieWithParent has the kernel SIGKILL the command when the agent dies (a
// crash, SIGKILL): a check that hangs must not outlive the agent that
// would have timed it out (procctl PROC_PDEATHSIG_CTL, kept across
// jexec's and env's execve, though not across an execve that changes the
// credentials: a set-ID program).
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

const pPID = 0 // idtype_t P_PID (sys/wait.h)

// WaitExited blocks until the child pid has exited, without reaping it:
// its zombie keeps the PID, and so its group's number, reserved. It is
// what os.Process does on FreeBSD (os/wait6_freebsd64.go).
func WaitExited(pid int) error {
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAIT6, pPID, uintptr(pid), 0, syscall.WEXITED|syscall.WNOWAIT, 0, 0)
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
