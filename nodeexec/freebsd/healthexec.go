package freebsd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/pgroup"
)

// CheckRunner is a Runner that also runs exec health checks: short
// commands whose whole process tree must end with their context. ExecRunner
// and the simulator are CheckRunners; the driver's Exec needs one.
type CheckRunner interface {
	// RunCheck runs argv (jexec and a check) to its end, as the leader of
	// a process group of its own with stdin /dev/null, and returns its
	// exit status and the first maxOutput bytes of its stdout and stderr
	// together. When ctx ends, the group is killed (which reaches the
	// check inside its jail: jexec execs it, in the same group) and
	// RunCheck returns with an error wrapping ctx.Err(). err is only for
	// a command that could not run, or ctx.
	RunCheck(ctx context.Context, argv []string, maxOutput int) (code int, output []byte, err error)
}

var (
	_ CheckRunner     = ExecRunner{}
	_ nodeexec.Execer = (*Driver)(nil)
)

// RunCheck implements CheckRunner with package pgroup.
func (r ExecRunner) RunCheck(ctx context.Context, argv []string, maxOutput int) (int, []byte, error) {
	if len(argv) == 0 {
		return -1, nil, errors.New("empty argv")
	}
	p, err := r.path(argv[0])
	if err != nil {
		return -1, nil, err
	}
	cmd := exec.Command(p, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = r.Env
	return pgroup.Run(ctx, cmd, maxOutput)
}

// Exec implements nodeexec.Execer: argv runs in the instance's jail as
// its workload does (see Start), `jexec keel-<name> /usr/bin/env -i <env>
// <argv>`, with the environment of its workload, argv expanded with it,
// never with the agent's. An instance started by an older agent, whose
// record holds no environment, gets PATH, HOME and KEEL_INSTANCE only.
//
// An instance runs for Exec while the workload this driver started runs
// (or its jail outlived it: the command started daemons), or while the
// last Running listed an instance it adopted. jexec's and env(1)'s own
// failures (no such jail, no such program: usr.sbin/jexec/jexec.c,
// usr.bin/env/env.c exit 127 or 126) are errors, not exit statuses.
//
// The check is a process of the jail while it runs, as every jexec is:
// Running counts it, and Stop ends it with the workload.
func (d *Driver) Exec(ctx context.Context, name string, argv []string, maxOutput int) (int, []byte, error) {
	if err := checkName("instance", name); err != nil {
		return -1, nil, err
	}
	if len(argv) == 0 {
		return -1, nil, fmt.Errorf("exec in %s: no command", name)
	}
	runner, ok := d.runner.(CheckRunner)
	if !ok {
		return -1, nil, fmt.Errorf("exec in %s: the driver's Runner (%T) cannot run checks", name, d.runner)
	}
	d.mu.Lock()
	c := d.children[name]
	_, adopted := d.adopted[name]
	running := adopted || c != nil && (!c.exited() || c.detached)
	var env []string
	if r := d.records[name]; r != nil {
		env = r.Env
	}
	d.mu.Unlock()
	if !running {
		return -1, nil, fmt.Errorf("exec in %s: not running: %w", name, nodeexec.ErrNotFound)
	}
	if env == nil {
		env = []string{"HOME=/root", nodeexec.EnvInstance + "=" + name, "PATH=" + defaultPath}
	}
	full, err := jexecArgv(name, env, argv)
	if err != nil {
		return -1, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	code, out, err := runner.RunCheck(ctx, full, maxOutput)
	if err != nil {
		return code, out, fmt.Errorf("exec in %s: %w", name, err)
	}
	if err := couldNotRun(code, out); err != nil {
		return -1, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	return code, out, nil
}

// couldNotRun tells jexec's and env(1)'s own failures from the check's:
// jexec's err(1, ...) when the jail is gone or has no /usr/bin/env, env's
// err(127 or 126, "%s", utility) when the check's program is missing or
// cannot be executed. Each is the first thing written, before the check
// runs.
func couldNotRun(code int, out []byte) error {
	line, _, _ := bytes.Cut(out, []byte("\n"))
	msg := strings.TrimSpace(string(line))
	switch {
	case code == 1 && strings.HasPrefix(msg, `jexec: jail "`) && strings.HasSuffix(msg, `" not found`):
		return fmt.Errorf("not running (%s): %w", msg, nodeexec.ErrNotFound)
	case code == 1 && strings.HasPrefix(msg, "jexec: execvp: "),
		(code == 127 || code == 126) && strings.HasPrefix(msg, "env: "):
		return errors.New(msg)
	}
	return nil
}
