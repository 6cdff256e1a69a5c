package fake

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
)

var _ nodeexec.Execer = (*Driver)(nil)

// ExecFunc is what the programs of an instance of the fake do: given a
// check's argv (expanded as the process driver expands it) and the
// instance's environment, it returns the exit status and the output, or an
// error for a program that cannot run. One that stands for a check that
// hangs blocks until ctx ends, and then returns.
type ExecFunc func(ctx context.Context, argv, env []string) (code int, output []byte, err error)

// SetExec sets what Exec runs in the named instance; nil removes it, and
// then every program is missing. It is kept while the instance is stopped,
// started again or adopted, as the files of its root would be.
func (d *Driver) SetExec(name string, f ExecFunc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f == nil {
		delete(d.programs, name)
		return
	}
	d.programs[name] = f
}

// Execs returns how many commands Exec ran in the named instance, and the
// argv of the last one.
func (d *Driver) Execs(name string) (int, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.execs[name], slices.Clone(d.lastExec[name])
}

// Exec implements nodeexec.Execer: the instance's ExecFunc (SetExec) runs
// with the environment of its last Start (kept across AgentRestart, as the
// process driver reads it back from the process), when it runs. Its output
// is cut to maxOutput; when ctx has ended by the time it returns, Exec
// fails with ctx's error, as a real driver that killed the check does.
func (d *Driver) Exec(ctx context.Context, name string, argv []string, maxOutput int) (int, []byte, error) {
	if err := checkName("instance", name); err != nil {
		return -1, nil, err
	}
	if len(argv) == 0 {
		return -1, nil, fmt.Errorf("exec in %s: no command", name)
	}
	d.mu.Lock()
	in := d.instances[name]
	if in == nil || !in.running {
		d.mu.Unlock()
		return -1, nil, fmt.Errorf("exec in %s: not running: %w", name, nodeexec.ErrNotFound)
	}
	env := slices.Clone(in.procEnv)
	f := d.programs[name]
	d.mu.Unlock()

	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	args := nodeexec.ExpandArgs(argv, vars)
	if f == nil {
		return -1, nil, fmt.Errorf("exec in %s: %q: no such program", name, args[0])
	}
	d.mu.Lock()
	d.execs[name]++
	d.lastExec[name] = args
	d.mu.Unlock()
	code, out, err := f(ctx, args, env)
	out = out[:min(len(out), max(maxOutput, 0))]
	if ctx.Err() != nil {
		return -1, slices.Clone(out), fmt.Errorf("exec in %s: %w", name, ctx.Err())
	}
	if err != nil {
		return -1, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	return code, slices.Clone(out), nil
}
