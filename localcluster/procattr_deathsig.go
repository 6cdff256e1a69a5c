//go:build linux || freebsd

package localcluster

import "syscall"

// agentProcAttr puts an agent in a process group of its own and has the
// kernel send it SIGTERM when the process that started it dies, so that
// a demo or a test binary killed outright (go test's timeout, SIGKILL)
// leaves no agent behind; its instances stay, as at any agent stop. On
// Linux the signal comes when the thread that started the agent exits:
// the Go runtime ends a thread only when a goroutine locked to it exits,
// which nothing that starts agents does.
func agentProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
