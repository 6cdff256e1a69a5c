package freebsd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Result is how a command that ran to its end ended.
type Result struct {
	Stdout, Stderr []byte
	// Code is the exit status; 0 is success.
	Code int
}

// Runner runs FreeBSD's commands for the driver: an argv, never a shell
// string. It is the seam between the driver and the machine: ExecRunner on
// a FreeBSD host, the simulator (package fbsdsim) in tests. A Runner is
// safe for concurrent use.
type Runner interface {
	// Run runs argv to its end and returns its output and exit status. err
	// is only for a command that could not run at all, or whose ctx ended;
	// a non-zero exit is a Result, not an error.
	Run(ctx context.Context, argv []string) (Result, error)
	// Start starts argv (jexec and a workload) in a process group of its
	// own, with stdin from /dev/null and stdout and stderr to the given
	// files, and returns at once. The caller must Wait for it.
	Start(argv []string, stdout, stderr *os.File) (Proc, error)
}

// Proc is a command started by Runner.Start.
type Proc interface {
	// Pid is its process ID on the host.
	Pid() int
	// Wait waits for it to end and returns its exit code, -1 when a signal
	// ended it. It may be called once.
	Wait() (code int, err error)
}

// Commands maps each command the driver runs to its absolute path on a
// FreeBSD host: the agent runs as root, so nothing is looked up in PATH.
var Commands = map[string]string{
	"jail":     "/usr/sbin/jail",
	"jexec":    "/usr/sbin/jexec",
	"jls":      "/usr/sbin/jls",
	"zfs":      "/sbin/zfs",
	"mount":    "/sbin/mount",
	"umount":   "/sbin/umount",
	"ifconfig": "/sbin/ifconfig",
	"route":    "/sbin/route",
	"rctl":     "/usr/bin/rctl",
	"sysctl":   "/sbin/sysctl",
	"pfctl":    "/sbin/pfctl",
	"ps":       "/bin/ps",
	"kill":     "/bin/kill",
}

// ExecRunner runs the commands as processes.
type ExecRunner struct {
	// BinDir, when set, holds every command under its bare name instead
	// of the paths of Commands (the simulator's executables in tests).
	BinDir string
	// Env, when set, is the commands' environment; nil inherits the
	// agent's.
	Env []string
}

// path returns the program to run for name.
func (r ExecRunner) path(name string) (string, error) {
	p, ok := Commands[name]
	if !ok {
		return "", fmt.Errorf("%q is not a command the freebsd driver runs", name)
	}
	if r.BinDir != "" {
		return filepath.Join(r.BinDir, name), nil
	}
	return p, nil
}

// maxOutput bounds what Run keeps of a command's stdout and of its stderr.
const maxOutput = 16 << 20

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, argv []string) (Result, error) {
	if len(argv) == 0 {
		return Result{}, errors.New("empty argv")
	}
	p, err := r.path(argv[0])
	if err != nil {
		return Result{}, err
	}
	cmd := exec.CommandContext(ctx, p, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = r.Env
	var stdout, stderr cappedBuffer
	stdout.max, stderr.max = maxOutput, maxOutput
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return res, fmt.Errorf("%s: %w", argv[0], ctx.Err())
	case errors.As(err, &exit):
		res.Code = exit.ExitCode()
		if res.Code < 0 {
			res.Code = 128 + int(exit.Sys().(syscall.WaitStatus).Signal())
		}
	default:
		return res, fmt.Errorf("%s: %w", argv[0], err)
	}
	return res, nil
}

// Start implements Runner.
func (r ExecRunner) Start(argv []string, stdout, stderr *os.File) (Proc, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty argv")
	}
	p, err := r.path(argv[0])
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = r.Env
	cmd.Stdin = nil // /dev/null
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", argv[0], err)
	}
	return execProc{cmd}, nil
}

type execProc struct{ cmd *exec.Cmd }

func (p execProc) Pid() int { return p.cmd.Process.Pid }

func (p execProc) Wait() (int, error) {
	err := p.cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return -1, err
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// cappedBuffer keeps the first max bytes written to it and drops the rest.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
