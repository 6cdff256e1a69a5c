// Package pgroup runs a short-lived command in a process group of its own
// and waits for it, so that nothing it started outlives it: the way the
// drivers run exec health checks (nodeexec.Execer). A check that hangs is
// killed with everything it started when its context ends, and Run returns
// then, however the command's descendants hold its output open.
//
// It must not be used for an instance's command, which outlives the agent
// (the drivers start those themselves).
package pgroup

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// waitDelay bounds how long Run waits, once the group is gone, for the
// command's output to reach its end: a descendant that left the group
// (setsid) may hold the pipe open for ever.
const waitDelay = time.Second

// Run starts cmd as the leader of a new process group, with stdin
// /dev/null and stdout and stderr into one buffer that keeps the first
// maxOutput bytes (the rest is read and dropped), and waits for it. cmd
// must not have been started and must leave Stdin, Stdout, Stderr and
// SysProcAttr.Setpgid to Run.
//
// When the leader ends, whatever it left in its group is killed
// (SIGKILL). When the calling process dies first (the agent crashed or was
// killed), the kernel kills the leader (SIGKILL); what the leader started
// in its group then runs on until it ends by itself. When ctx ends first, the whole group is killed, and Run
// returns once the leader is reaped, with an error wrapping ctx.Err().
// The group's number cannot be taken by another process meanwhile: the
// leader is reaped only after the last signal, and its zombie holds the
// number until then.
//
// code is the leader's exit status, 128+n when signal n ended it. err is
// only for a command that could not start (a missing program), for ctx,
// or for a system that Run does not support (it needs waitid on Linux or
// wait6 on 64-bit FreeBSD); a non-zero exit is a code, not an error.
func Run(ctx context.Context, cmd *exec.Cmd, maxOutput int) (code int, output []byte, err error) {
	if err := ctx.Err(); err != nil {
		return -1, nil, err
	}
	if !supported {
		return -1, nil, fmt.Errorf("running %s in a process group: %w", cmd.Path, errors.ErrUnsupported)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	dieWithParent(cmd.SysProcAttr)
	// On Linux the parent-death signal comes when the thread that started
	// the command exits, not the process: hold this goroutine to its
	// thread until the command is reaped, so that no other goroutine's
	// exit while locked to it (a dependency's, say) ends the thread and
	// kills the check. One parked thread per running check.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	out := &capped{max: maxOutput}
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = out, out // one pipe, one copier
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return -1, nil, err
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- WaitExited(pid) }()
	var ctxErr error
	var werr error
	select {
	case werr = <-exited:
	case <-ctx.Done():
		ctxErr = ctx.Err()
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		werr = <-exited
	}
	if werr != nil {
		// Not expected: waitid fails only for a pid that is not our
		// child. Kill the leader through its handle, which is safe
		// whatever happened, and reap it.
		_ = cmd.Process.Kill()
	} else {
		// The leader has ended and is not reaped: its group's number is
		// still its own. What it left behind goes with it.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	waitErr := cmd.Wait()
	if ctxErr != nil {
		return -1, out.Bytes(), fmt.Errorf("%s: %w", cmd.Path, ctxErr)
	}
	var exit *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exit) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return -1, out.Bytes(), waitErr
	}
	if werr != nil {
		return -1, out.Bytes(), fmt.Errorf("waiting for %s: %w", cmd.Path, werr)
	}
	return exitCode(cmd), out.Bytes(), nil
}

// exitCode is the exit status of a reaped command: 128+n for signal n,
// as a shell shows it.
func exitCode(cmd *exec.Cmd) int {
	ps := cmd.ProcessState
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	b   []byte
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte { return c.b }
