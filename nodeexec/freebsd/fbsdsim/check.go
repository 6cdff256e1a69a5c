package fbsdsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/pgroup"
)

var _ freebsd.CheckRunner = (*Sim)(nil)

// RunCheck implements freebsd.CheckRunner for ["jexec", jail, cmd...] in
// the in-process mode. jexec's own failures are Start's (usage, `jexec:
// jail "<name>" not found`, `jexec: execvp: <cmd>: No such file or
// directory` for a command not in the jail's root: exit 1, from
// usr.sbin/jexec/jexec.c main); a failure injected with FailNext for the
// argv's prefix is returned as it is. Otherwise the command runs as the
// executable mode's jexec runs it (JexecMain): env(1) as envRun models it,
// any other the host's program of that name with the caller's environment,
// in the jail's root directory (as jexec chdirs to "/" after jail_attach),
// as a real process group that ends when ctx does (package pgroup). Unlike
// the executable's, it is not recorded as a process of the jail: ps does
// not show it.
func (s *Sim) RunCheck(ctx context.Context, argv []string, maxOutput int) (int, []byte, error) {
	if s.disk {
		return -1, nil, errors.New("fbsdsim: the executable mode runs checks through the jexec executable")
	}
	if len(argv) == 0 || argv[0] != "jexec" {
		return -1, nil, fmt.Errorf("fbsdsim: RunCheck runs jexec only, not %q", argv)
	}
	var msg bytes.Buffer
	cut := func(b []byte) []byte { return b[:min(len(b), max(maxOutput, 0))] }
	if code, ok := s.injected(argv, &msg); ok {
		return code, cut(msg.Bytes()), nil
	}
	jname, cmd, text, code := jexecArgs(argv)
	if code != 0 {
		return code, cut([]byte(text)), nil
	}
	dir := ""
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		j := lookupJail(st, jname)
		switch {
		case j == nil:
			text = fmt.Sprintf("jexec: jail \"%s\" not found\n", jname)
		case !s.inJailPath(j, cmd[0]):
			text = execvpMsg(cmd[0])
		default:
			dir = filepath.Join(s.root, j.Path)
		}
		return nil
	})
	if dir == "" {
		return 1, cut([]byte(text)), nil
	}
	var c *exec.Cmd
	if filepath.Base(cmd[0]) == "env" {
		path, args, env, text, code := envRun(cmd, os.Environ())
		if code != 0 {
			return code, cut([]byte(text)), nil
		}
		c = &exec.Cmd{Path: path, Args: args, Env: env, Dir: dir}
	} else {
		path, err := exec.LookPath(cmd[0])
		if err != nil {
			text = fmt.Sprintf("fbsdsim: jexec %s %s: this host has no such program to run\n", jname, cmd[0])
			return 1, cut([]byte(text)), nil
		}
		c = &exec.Cmd{Path: path, Args: cmd, Dir: dir}
	}
	return pgroup.Run(ctx, c, maxOutput)
}

// envRun is what env(1) does with argv (usr.bin/env/env.c main, as the
// drivers call it: `/usr/bin/env -i NAME=value... command...`): -i empties
// the environment, each NAME=value sets a variable (the last wins), and the
// command is looked up in the PATH of the new environment (_PATH_DEFPATH
// /usr/bin:/bin without one) and executed, or err(errno == ENOENT ? 127 :
// 126, "%s", command): `env: <command>: No such file or directory`. The
// command is looked up on this host, as jexec's is. Options other than -i
// are not modelled; neither is printing the environment (no command).
// base is the environment without -i. It returns the program and its argv
// and environment, or the message and the exit status.
func envRun(argv, base []string) (path string, args, env []string, msg string, code int) {
	env = base
	rest := argv[1:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
		if rest[0] != "-i" {
			return "", nil, nil, fmt.Sprintf("fbsdsim: env %s: options other than -i are not modelled\n", rest[0]), 1
		}
		env, rest = nil, rest[1:]
	}
	vars := map[string]int{}
	env = slices.Clone(env)
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		vars[k] = i
	}
	for ; len(rest) > 0 && strings.Contains(rest[0], "="); rest = rest[1:] {
		k, _, _ := strings.Cut(rest[0], "=")
		if i, ok := vars[k]; ok {
			env[i] = rest[0]
			continue
		}
		vars[k] = len(env)
		env = append(env, rest[0])
	}
	if len(rest) == 0 {
		return "", nil, nil, "fbsdsim: env without a command (printing the environment) is not modelled\n", 1
	}
	pathVar := "/usr/bin:/bin"
	if i, ok := vars["PATH"]; ok {
		pathVar = strings.TrimPrefix(env[i], "PATH=")
	}
	path, errno := lookPathIn(rest[0], pathVar)
	if errno != 0 {
		code = 126
		if errno == syscall.ENOENT {
			code = 127
		}
		return "", nil, nil, fmt.Sprintf("env: %s: %s\n", rest[0], strerror[errno]), code
	}
	return path, rest, env, "", 0
}

// lookPathIn finds file as execvp(3) does in pathVar: a name with a slash
// as it is, else the first directory holding an executable file of that
// name. It returns the errno execvp would fail with: ENOENT when nothing
// is found, EACCES when only something not executable is.
func lookPathIn(file, pathVar string) (string, syscall.Errno) {
	try := []string{file}
	if !strings.Contains(file, "/") {
		try = nil
		for _, dir := range filepath.SplitList(pathVar) {
			if dir == "" {
				dir = "."
			}
			try = append(try, filepath.Join(dir, file))
		}
	}
	errno := syscall.ENOENT
	for _, p := range try {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
		case fi.Mode().IsRegular() && fi.Mode()&0o111 != 0:
			return p, 0
		default:
			errno = syscall.EACCES
		}
	}
	return "", errno
}

// strerror is lib/libc/gen/errlst.c's text for the errnos lookPathIn
// returns.
var strerror = map[syscall.Errno]string{
	syscall.ENOENT: "No such file or directory",
	syscall.EACCES: "Permission denied",
}
