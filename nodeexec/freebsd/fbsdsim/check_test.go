package fbsdsim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRunCheck(t *testing.T) {
	s, root := host(t)
	must(t, s, "zfs", "snapshot", "zroot/keel/base/test@keel")
	must(t, s, "zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/web")
	must(t, s, "jail", "-c", "name=keel-web", "path=/zroot/keel/jails/web", "persist")
	jailRoot := filepath.Join(root, "zroot/keel/jails/web")
	tests := []struct {
		name   string
		argv   []string
		code   int
		output string
	}{
		{"the host's program, in the jail's root", []string{"jexec", "keel-web", "/bin/sh", "-c", "pwd; exit 2"}, 2, jailRoot + "\n"},
		{"no such jail", []string{"jexec", "keel-db", "/bin/sh"}, 1, "jexec: jail \"keel-db\" not found\n"},
		{"not in the jail's root", []string{"jexec", "keel-web", "/usr/bin/env", "true"}, 1, "jexec: execvp: /usr/bin/env: No such file or directory\n"},
		{"usage", []string{"jexec"}, 1, jexecUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := s.RunCheck(t.Context(), tt.argv, 1000)
			if err != nil || code != tt.code || string(out) != tt.output {
				t.Errorf("RunCheck = %d, %q, %v; want %d, %q", code, out, err, tt.code, tt.output)
			}
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := s.RunCheck(ctx, []string{"jexec", "keel-web", "/bin/sleep", "60"}, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RunCheck of a check that hangs: %v; want the deadline", err)
	}
}

// envRun models usr.bin/env/env.c main as the drivers call it.
func TestEnvRun(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		argv []string
		path string
		args []string
		env  []string
		msg  string
		code int
	}{
		{"-i and variables, the last wins", []string{"/usr/bin/env", "-i", "A=1", "PATH=/bin:/usr/bin", "A=2", "sh", "-c", "x"},
			"/bin/sh", []string{"sh", "-c", "x"}, []string{"A=2", "PATH=/bin:/usr/bin"}, "", 0},
		{"the environment kept without -i", []string{"env", "B=2", "/bin/sh"}, "/bin/sh", []string{"/bin/sh"}, []string{"A=1", "B=2"}, "", 0},
		{"a program not found", []string{"/usr/bin/env", "-i", "PATH=/bin", "no-such-program"}, "", nil, nil,
			"env: no-such-program: No such file or directory\n", 127},
		{"_PATH_DEFPATH without PATH", []string{"env", "-i", "env"}, "/usr/bin/env", []string{"env"}, nil, "", 0},
		{"a file that is not executable", []string{"env", "-i", filepath.Join(dir, "data")}, "", nil, nil,
			"env: " + filepath.Join(dir, "data") + ": Permission denied\n", 126},
		{"another option", []string{"env", "-u", "A", "sh"}, "", nil, nil, "fbsdsim: env -u: options other than -i are not modelled\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, args, env, msg, code := envRun(tt.argv, []string{"A=1"})
			if path != tt.path || !equal(args, tt.args) || !equal(env, tt.env) || msg != tt.msg || code != tt.code {
				t.Errorf("envRun = %q %q %q %q %d; want %q %q %q %q %d", path, args, env, msg, code, tt.path, tt.args, tt.env, tt.msg, tt.code)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
