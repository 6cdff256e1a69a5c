//go:build !linux && !freebsd

package localcluster

import "syscall"

// agentProcAttr puts an agent in a process group of its own.
func agentProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
