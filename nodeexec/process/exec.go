package process

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/pgroup"
)

var _ nodeexec.Execer = (*Driver)(nil)

// Exec implements nodeexec.Execer: argv runs as the instance's command
// does (see Start: the same $NAME expansion and PATH lookup, the same
// environment, root/ as its working directory), in a process group of its
// own (package pgroup), stdin /dev/null. The environment is the one this
// driver computed at the instance's Start or, for an instance an earlier
// agent started (known once Running has listed it), the one its process
// was started with (/proc/<pid>/environ).
func (d *Driver) Exec(ctx context.Context, name string, argv []string, maxOutput int) (int, []byte, error) {
	if err := checkName("instance", name); err != nil {
		return -1, nil, err
	}
	if len(argv) == 0 {
		return -1, nil, fmt.Errorf("exec in %s: no command", name)
	}
	envList, err := d.runningEnv(name)
	if err != nil {
		return -1, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	env := make(map[string]string, len(envList))
	for _, kv := range envList {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, dup := env[k]; !dup { // the first wins, as getenv(3)
				env[k] = v
			}
		}
	}
	root, err := d.RootDir(name)
	if err != nil {
		return -1, nil, err
	}
	args := nodeexec.ExpandArgs(argv, env)
	path, err := lookPath(args[0], env["PATH"], root)
	if err != nil {
		return -1, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	cmd := &exec.Cmd{Path: path, Args: args, Env: envList, Dir: root}
	code, out, err := pgroup.Run(ctx, cmd, maxOutput)
	if err != nil {
		return code, out, fmt.Errorf("exec in %s: %w", name, err)
	}
	return code, out, nil
}

// runningEnv returns the environment of the named instance if it runs: its
// own (the driver's child) or an adopted one's, read from /proc.
func (d *Driver) runningEnv(name string) ([]string, error) {
	d.mu.Lock()
	c := d.children[name]
	env := d.env[name]
	a, adopted := d.adopted[name]
	d.mu.Unlock()
	switch {
	case c != nil && isAlive(c.proc.PID, c.proc.StartTime):
		return env, nil
	case adopted && isAlive(a.PID, a.StartTime):
		b, err := os.ReadFile("/proc/" + strconv.Itoa(a.PID) + "/environ")
		if err != nil {
			return nil, fmt.Errorf("reading the environment of pid %d: %w", a.PID, err)
		}
		var env []string
		for kv := range bytes.SplitSeq(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
			env = append(env, string(kv))
		}
		if !isAlive(a.PID, a.StartTime) {
			// The PID was reused between the two reads.
			return nil, fmt.Errorf("not running: %w", nodeexec.ErrNotFound)
		}
		return env, nil
	}
	return nil, fmt.Errorf("not running: %w", nodeexec.ErrNotFound)
}
