// Package docs holds the documentation and a test that runs the commands it
// shows, so that every command a reader pastes works as printed.
//
// The conventions, for README.md, repo-example/README.md and docs/**/*.md:
//
//   - A fenced block is a shell block when its info string is sh, bash,
//     shell or console, or when it has none and a line starts with "$ ".
//     Every shell block is run, unless the line right before its fence is
//     <!-- not run: REASON --> with the reason it cannot run here (a
//     FreeBSD host, root, a real forge, a scenario the docs do not build).
//   - A block with "$ " lines is a transcript: each "$ " line is a command
//     (continued on the next line when it ends in \ or |), the other lines
//     its output, which is not compared. A command must exit 0, unless its
//     output shows an error line ("keel: ...", the CLI's error prefix), when
//     it must fail, or it ends with the comment "# exit status N".
//   - Any other shell block is a script, run with bash -e -o pipefail.
//   - Blocks run in the order of their file, in one sandbox per file: a
//     temporary HOME, keel built from this tree first on PATH,
//     GIT_CONFIG_GLOBAL=/dev/null, a git identity, and a copy of the source
//     tree as the first working directory. A cd carries over to the next
//     block. <!-- run in: example --> before a block starts it instead in a
//     git repository made from repo-example (commit "initial cluster" on
//     main, pushed to a bare origin).
//   - <!-- write: PATH --> before a block writes its text to PATH, relative
//     to the working directory (for a file the docs tell the reader to
//     create).
//
// TestDemoCommands starts keel demo and runs, in order, the commands it
// prints.
package docs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/proctest"
)

// block is one fenced block of a Markdown file.
type block struct {
	file      string // relative to the source root
	line      int    // of the opening fence
	info      string // the info string
	text      string // the content, the fence's indentation removed
	directive string // the comment on the line before the fence, without <!-- -->
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	fenceRE     = regexp.MustCompile("^( *)(```+|~~~+)\\s*(.*)$")
	directiveRE = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)
	exitRE      = regexp.MustCompile(`#\s*exit status (\d+)\s*$`)
)

// parseBlocks returns the fenced blocks of a Markdown text.
func parseBlocks(file, text string) []block {
	var out []block
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, fence := len(m[1]), m[2]
		b := block{file: file, line: i + 1, info: m[3]}
		for j := i - 1; j >= 0; j-- {
			if t := strings.TrimSpace(lines[j]); t != "" {
				if d := directiveRE.FindStringSubmatch(t); d != nil {
					b.directive = d[1]
				}
				break
			}
		}
		var body []string
		for i++; i < len(lines); i++ {
			l := lines[i]
			if strings.TrimSpace(l) == fence || (strings.HasPrefix(strings.TrimSpace(l), fence) && strings.Trim(strings.TrimSpace(l), fence[:1]) == "") {
				break
			}
			for k := 0; k < indent && strings.HasPrefix(l, " "); k++ {
				l = l[1:]
			}
			body = append(body, l)
		}
		b.text = strings.Join(body, "\n") + "\n"
		out = append(out, b)
	}
	return out
}

// isShell says whether a block holds commands (see the package comment).
func (b block) isShell() bool {
	switch strings.Fields(b.info + " x")[0] {
	case "sh", "bash", "shell", "console":
		return true
	case "x":
		return b.isTranscript()
	}
	return false
}

func (b block) isTranscript() bool {
	for l := range strings.SplitSeq(b.text, "\n") {
		if strings.HasPrefix(l, "$ ") {
			return true
		}
	}
	return false
}

// command is one command of a transcript and the exit status it must have.
type command struct {
	line  int // in the file
	text  string
	exit  int  // when !fails
	fails bool // any non-zero status
}

func (b block) commands() []command {
	var out []command
	lines := strings.Split(b.text, "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "$ ") {
			continue
		}
		c := command{line: b.line + 1 + i, text: strings.TrimPrefix(lines[i], "$ ")}
		for (strings.HasSuffix(c.text, "\\") || strings.HasSuffix(c.text, "|")) && i+1 < len(lines) {
			i++
			c.text += "\n" + lines[i]
		}
		for j := i + 1; j < len(lines) && !strings.HasPrefix(lines[j], "$ "); j++ {
			if strings.HasPrefix(lines[j], "keel: ") {
				c.fails = true
			}
		}
		if m := exitRE.FindStringSubmatch(c.text); m != nil {
			c.exit, _ = strconv.Atoi(m[1])
			c.fails = false
		}
		out = append(out, c)
	}
	return out
}

// docFiles lists the Markdown files whose commands are run.
func docFiles(t *testing.T, root string) []string {
	files := []string{"README.md", "repo-example/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestParseBlocks(t *testing.T) {
	md := "text\n<!-- not run: needs root -->\n```sh\nrm -rf /x\n```\n\n  ```\n  $ keel plan -o html \\\n      -x\n  keel: bad\n  $ keel validate   # exit status 1\n  out\n  ```\n```yaml\na: 1\n```\n"
	bs := parseBlocks("f.md", md)
	if len(bs) != 3 {
		t.Fatalf("%d blocks, want 3: %+v", len(bs), bs)
	}
	if b := bs[0]; b.line != 3 || b.directive != "not run: needs root" || !b.isShell() || b.isTranscript() || b.text != "rm -rf /x\n" {
		t.Errorf("first block %+v", b)
	}
	cs := bs[1].commands()
	if !bs[1].isShell() || len(cs) != 2 || cs[0].text != "keel plan -o html \\\n    -x" || !cs[0].fails || cs[0].line != 8 ||
		cs[1].fails || cs[1].exit != 1 || cs[1].line != 11 {
		t.Errorf("transcript %+v: commands %+v", bs[1], cs)
	}
	if bs[2].isShell() {
		t.Errorf("a yaml block is not a shell block")
	}
}

// sandbox is where one file's commands run.
type sandbox struct {
	t       *testing.T
	cred    *syscall.Credential // who runs the commands; nil: the test's user
	root    string              // the source tree
	dir     string
	env     []string
	cwd     string
	example string // made on first use
}

func sourceRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// keelBin builds keel the way make build does, once per test binary.
var keelBin = struct {
	path string
	err  error
	done bool
}{}

func buildKeel(t *testing.T, root string) string {
	t.Helper()
	if !keelBin.done {
		keelBin.done = true
		dir, err := os.MkdirTemp("", "keel-docs-bin-")
		if err == nil {
			err = os.Chmod(dir, 0o755) // the unprivileged user runs it
		}
		if err == nil {
			keelBin.path = filepath.Join(dir, "keel")
			cmd := exec.Command("make", "-s", "build", "BIN="+keelBin.path)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
			if out, err2 := cmd.CombinedOutput(); err2 != nil {
				err = fmt.Errorf("make build: %w\n%s", err2, out)
			}
		}
		keelBin.err = err
	}
	if keelBin.err != nil {
		t.Fatal(keelBin.err)
	}
	return keelBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if keelBin.path != "" {
		os.RemoveAll(filepath.Dir(keelBin.path))
	}
	os.Exit(code)
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the docs' commands are run on Linux (the demo's process driver)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("KEEL_REQUIRE_TOOLS") != "" {
				// CI (.ci/run) installs them: a skip there would hide a
				// broken command.
				t.Fatalf("running the docs' commands needs %s: %v", tool, err)
			}
			t.Skipf("running the docs' commands needs %s: %v", tool, err)
		}
	}
}

// unprivileged is who runs the docs' commands when the test runs as root,
// so that a block nobody marked (say, one that writes /boot/loader.conf or
// adds a user) fails instead of changing the machine.
var unprivileged = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}

func newSandbox(t *testing.T, root string) *sandbox {
	keel := buildKeel(t, root)
	dir, err := os.MkdirTemp("", "keel-docs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &sandbox{t: t, root: root, dir: dir}
	home, bin, src := filepath.Join(s.dir, "home"), filepath.Join(s.dir, "bin"), filepath.Join(s.dir, "keel")
	for _, d := range []string{home, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(keel, filepath.Join(bin, "keel")); err != nil {
		t.Fatal(err)
	}
	s.env = sandboxEnv(home, bin)
	// A copy of the tracked files: a block may write where it runs.
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for name := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the work tree
		}
		fi, _ := os.Stat(filepath.Join(root, name))
		dst := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	s.cwd = src
	if os.Geteuid() == 0 {
		s.cred = unprivileged
		err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, int(unprivileged.Uid), int(unprivileged.Gid))
		})
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// sandboxEnv is the environment of a command run for a reader: HOME and
// the go command's caches in the sandbox, keel first on PATH, no git
// configuration but an identity.
func sandboxEnv(home, bin string) []string {
	env := []string{
		"HOME=" + home, "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=Docs Reader", "GIT_AUTHOR_EMAIL=reader@example.com",
		"GIT_COMMITTER_NAME=Docs Reader", "GIT_COMMITTER_EMAIL=reader@example.com",
		"GOPATH=" + filepath.Join(home, "go"), "GOCACHE=" + filepath.Join(home, ".cache", "go-build"),
		"TERM=dumb", "LANG=C.UTF-8", "TMPDIR=" + os.TempDir(),
	}
	for _, k := range []string{"GOTOOLCHAIN", "GOPROXY", "GOFLAGS"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// exampleRepo makes, once, a git repository from repo-example with a bare
// origin, the way a reader starts a cluster repository.
func (s *sandbox) exampleRepo() string {
	if s.example != "" {
		return s.example
	}
	s.example = filepath.Join(s.dir, "example")
	bare := filepath.Join(s.dir, "example.git")
	script := fmt.Sprintf(`cp -r %[1]s/repo-example %[2]s && cd %[2]s && git init -q -b main && git add -A && git commit -qm "initial cluster" &&
git init -q --bare %[3]s && git remote add origin %[3]s && git push -q -u origin main`, s.cwdSource(), s.example, bare)
	if out, code := s.bash(s.dir, script); code != 0 {
		s.t.Fatalf("making the example repository: exit %d\n%s", code, out)
	}
	return s.example
}

func (s *sandbox) cwdSource() string { return filepath.Join(s.dir, "keel") }

// bash runs script in dir and returns its output and exit status; the
// directory it ends in becomes the sandbox's working directory.
func (s *sandbox) bash(dir, script string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cwdFile := filepath.Join(s.dir, ".cwd")
	os.Remove(cwdFile)
	full := fmt.Sprintf("trap 'pwd > %s' EXIT\nset -o pipefail\n%s", cwdFile, script)
	cmd := exec.CommandContext(ctx, "bash", "-c", full)
	cmd.Dir, cmd.Env = dir, s.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.SysProcAttr.Credential = s.cred
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if b, rerr := os.ReadFile(cwdFile); rerr == nil {
		s.cwd = strings.TrimSpace(string(b))
	}
	if ctx.Err() != nil {
		return out.String() + "\n(timed out after 1m)", -1
	}
	if err != nil && cmd.ProcessState == nil {
		return out.String() + err.Error(), -1
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// run runs one shell block and reports each failure with the file and line.
func (s *sandbox) run(b block) {
	t := s.t
	dir := s.cwd
	for _, d := range strings.Split(b.directive, ";") {
		d = strings.TrimSpace(d)
		switch {
		case d == "run in: example":
			dir = s.exampleRepo()
		case d == "run in: source":
			dir = s.cwdSource()
		case d != "" && !strings.HasPrefix(d, "write:"):
			t.Errorf("%s: unknown directive <!-- %s --> (want run in: example|source, write: PATH or not run: REASON)", b.where(), d)
			return
		}
	}
	if !b.isTranscript() {
		out, code := s.bash(dir, "set -e\n"+b.text)
		if code != 0 {
			t.Errorf("%s: the ```%s block fails when pasted (exit %d, run in %s):\n%s\noutput:\n%s\nfix the commands, or put <!-- not run: REASON --> on the line before the fence", b.where(), b.info, code, dir, indent(b.text), indent(out))
		}
		return
	}
	for _, c := range b.commands() {
		out, code := s.bash(dir, c.text)
		dir = s.cwd
		switch {
		case c.fails && code == 0:
			t.Errorf("%s: `%s` succeeds, but the docs show it failing (a keel: line)\noutput:\n%s", fmt.Sprintf("%s:%d", b.file, c.line), c.text, indent(out))
		case !c.fails && code != c.exit:
			t.Errorf("%s: `%s` exits %d, want %d (run in %s)\noutput:\n%s\nfix the command, mark an expected status with '# exit status N', or put <!-- not run: REASON --> on the line before the fence", fmt.Sprintf("%s:%d", b.file, c.line), c.text, code, c.exit, dir, indent(out))
		}
	}
}

// write carries out <!-- write: PATH -->.
func (s *sandbox) write(b block) {
	for _, d := range strings.Split(b.directive, ";") {
		d = strings.TrimSpace(d)
		if p, ok := strings.CutPrefix(d, "write:"); ok {
			p = filepath.Join(s.cwd, strings.TrimSpace(p))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				s.t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(b.text), 0o644); err != nil {
				s.t.Fatalf("%s: %v", b.where(), err)
			}
			if s.cred != nil {
				_ = os.Chown(p, int(s.cred.Uid), int(s.cred.Gid))
			}
		}
	}
}

func indent(s string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString("    " + sc.Text() + "\n")
	}
	return b.String()
}

// TestDocCommands runs every shell block of the docs (see the package
// comment).
func TestDocCommands(t *testing.T) {
	needTools(t, "git", "make", "bash", "go")
	root := sourceRoot(t)
	for _, file := range docFiles(t, root) {
		t.Run(strings.ReplaceAll(file, "/", "_"), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				t.Fatal(err)
			}
			var s *sandbox
			for _, b := range parseBlocks(file, string(data)) {
				if reason, ok := strings.CutPrefix(b.directive, "not run:"); ok {
					if strings.TrimSpace(reason) == "" {
						t.Errorf("%s: <!-- not run: --> needs a reason", b.where())
					}
					continue
				}
				if s == nil && (b.isShell() || strings.Contains(b.directive, "write:")) {
					s = newSandbox(t, root)
				}
				if strings.Contains(b.directive, "write:") {
					s.write(b)
					continue
				}
				if b.isShell() {
					s.run(b)
				}
			}
		})
	}
}

// demoLine is a line of keel demo's output that may hold a command: two
// spaces, perhaps a label (a node or Service name) and two more.
var demoLine = regexp.MustCompile(`^  (?:[a-z0-9-]+ {2,})?(\S.*)$`)

// demoCommands picks the commands out of keel demo's output, in order.
func demoCommands(out string) []string {
	var cmds []string
	for l := range strings.SplitSeq(out, "\n") {
		m := demoLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		word := strings.Fields(m[1])[0]
		switch {
		case word == "cd", word == "sed", word == "curl", word == "kill", word == "openssl", word == "git",
			filepath.Base(word) == "keel", strings.Contains(word, "="):
			cmds = append(cmds, m[1])
		}
	}
	return cmds
}

// TestDemoCommands starts keel demo as make demo does and runs every
// command it prints, in the order printed, the way a reader pastes them:
// the curls, stopping one node and starting it again, the deploy by git
// push and the commands that watch it, and killing the Ingress's owner.
func TestDemoCommands(t *testing.T) {
	needTools(t, "git", "make", "bash", "go", "curl", "openssl")
	if testing.Short() {
		t.Skip("-short: keel demo starts three agents and a Pebble")
	}
	root := sourceRoot(t)
	keel := buildKeel(t, root)
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{t: t, root: root, dir: dir, cwd: dir, env: sandboxEnv(home, filepath.Dir(keel))}
	// The demo builds Pebble once into the user's cache, with go: keep
	// both caches the developer's (a later entry wins in exec's Env).
	goenv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatal(err)
	}
	gv := strings.Split(string(goenv), "\n")
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	s.env = append(s.env, "GOCACHE="+gv[0], "GOMODCACHE="+gv[1], "GOPATH="+gv[2], "XDG_CACHE_HOME="+cache)

	demo := exec.Command(keel, "demo", "--dir", filepath.Join(dir, "demo"))
	demo.Dir, demo.Env = root, s.env
	var out syncBuffer
	demo.Stdout, demo.Stderr = &out, &out
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- demo.Wait() }()
	var restarted []int // agents the commands started again
	t.Cleanup(func() {
		for _, pid := range restarted {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			waitGone(pid, time.Minute)
		}
		_ = demo.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			_ = demo.Process.Kill()
			<-exited
		}
	})
	const ready = "Press Ctrl-C to stop the demo."
	deadline := time.Now().Add(5 * time.Minute)
	for !strings.Contains(out.String(), ready) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("keel demo exited (%v) before it was ready:\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("keel demo not ready after 5 minutes:\n%s", out.String())
		}
	}
	printed := out.String()
	cmds := demoCommands(printed)
	// What the demo must print at least: a node stopped and started again,
	// a deploy from the work tree, and the commands that watch it.
	for _, want := range []string{"cd ", "kill ", " agent ", " lock ", " node status ", " plan "} {
		if !slices.ContainsFunc(cmds, func(c string) bool { return strings.Contains(c+" ", want) }) {
			t.Errorf("keel demo prints no command with %q:\n%s", want, printed)
		}
	}
	pidFile := filepath.Join(dir, "restarted.pid")
	for _, c := range cmds {
		script := c
		background := strings.HasSuffix(c, "&")
		// A command that serves until stopped (keel dashboard) runs in the
		// background until it answers on its --listen address.
		f := strings.Fields(c)
		listen := ""
		if i := slices.Index(f, "--listen"); i >= 0 && i+1 < len(f) && slices.Contains(f, "dashboard") && !background {
			listen = f[i+1]
			script += " &"
			background = true
		}
		if background {
			script += fmt.Sprintf("\necho $! > %s", pidFile)
		}
		res, code := s.bash(s.cwd, script)
		t.Logf("$ %s  (exit %d)", c, code)
		if code != 0 {
			t.Errorf("keel demo printed `%s`, which fails when pasted (exit %d, in %s):\n%s", c, code, s.cwd, indent(res))
			continue
		}
		switch {
		case listen != "":
			b, _ := os.ReadFile(pidFile)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("`%s`: no PID: %v", c, err)
			}
			if err := waitServing(listen, time.Minute); err != nil {
				t.Errorf("keel demo printed `%s`, which does not serve %s/healthz: %v\n%s", c, listen, err, indent(res))
			}
			_ = syscall.Kill(pid, syscall.SIGTERM)
			waitGone(pid, time.Minute)
		case strings.Contains(c, " demo-image "):
			// The new build reaches every replica: the VIP answers
			// /version with v2 only, from each of the three.
			i := slices.Index(f, "--duration")
			if i < 0 || i+2 >= len(f) {
				t.Fatalf("`%s`: no URL after demo-load --duration", c)
			}
			url := f[i+2] + "version"
			if err := waitVersion(url, "v2", 3, 2*time.Minute); err != nil {
				t.Errorf("after `%s`: %v", c, err)
			}
		case f[0] == "kill":
			pid, _ := strconv.Atoi(f[len(f)-1])
			if !waitGone(pid, time.Minute) {
				t.Fatalf("`%s`: the process still runs a minute later", c)
			}
		case background:
			b, _ := os.ReadFile(pidFile)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				restarted = append(restarted, pid)
			}
		case f[0] == "cd":
			// The demo's repository validates without a warning (it
			// used to warn about every node's missing reportKey).
			res, code := s.bash(s.cwd, "keel validate")
			if code != 0 || !strings.Contains(res, "; 0 warnings") {
				t.Errorf("keel validate in the demo's work tree (exit %d):\n%s", code, indent(res))
			}
		}
	}
}

// waitServing waits until GET http://addr/healthz answers 200.
func waitServing(addr string, d time.Duration) error {
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	var last error
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		res, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			last = err
			continue
		}
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("%s", res.Status)
	}
	return last
}

// waitGone waits until pid no longer exists (or is a zombie).
func waitGone(pid int, d time.Duration) bool { return proctest.WaitGone(pid, d) }

// syncBuffer is a bytes.Buffer that a process writes while the test reads.
type syncBuffer struct {
	mu  stdsync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestDemoCommandsParse(t *testing.T) {
	out, err := os.ReadFile("testdata/demo-output.txt") // keel demo's output, captured
	if err != nil {
		t.Fatal(err)
	}
	got := demoCommands(string(out))
	want := []string{
		"curl http://127.78.137.4:5432/",
		"curl http://127.78.41.72:8080/",
		"kill 1003",
		"GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 /work/wt/release/bin/keel agent",
		"cd /tmp/rel-demo/c/cluster",
		"sed -i 's/replicas: 3/replicas: 5/' apps/web.yaml",
		"/work/wt/release/bin/keel lock && git commit",
		"/work/wt/release/bin/keel node status --state-dir /tmp/rel-demo/c/nodes/n1",
		"/work/wt/release/bin/keel plan --repo /tmp/rel-demo/c/cluster --reports-remote origin",
		"/work/wt/release/bin/keel demo-load --duration 12s http://127.78.41.72:8080/ & sleep 1; sed",
		"sed -i 's/HEALTHZ: ok/HEALTHZ: fail/' apps/web.yaml",
		"/work/wt/release/bin/keel demo-load --duration 20s",
		"curl -s http://127.0.0.1:41499/metrics | grep",
		"/work/wt/release/bin/keel plan --repo /tmp/rel-demo/c/cluster --reports-remote origin | grep",
		"git revert --no-edit HEAD && git push -q origin main",
		"curl --cacert /tmp/rel-demo/c/pebble-roots.pem --resolve www.keel.test:33877:127.0.1.1",
		"curl --cacert /tmp/rel-demo/c/pebble-roots.pem --resolve www.keel.test:33877:127.0.1.2",
		"curl --cacert /tmp/rel-demo/c/pebble-roots.pem --resolve www.keel.test:33877:127.0.1.3",
		"kill -9 1001",
		"curl --cacert /tmp/rel-demo/c/pebble-roots.pem --resolve www.keel.test:33877:127.0.1.2",
		"openssl s_client -connect 127.0.1.2:33877",
	}
	if len(got) != len(want) {
		t.Fatalf("%d commands, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("command %d is %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

// waitVersion waits until url answers want from at least n different
// instances and nothing else in a row of 3n requests, each on a connection of its
// own (the VIP's proxy picks an endpoint per connection).
func waitVersion(url, want string, n int, timeout time.Duration) error {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		from := map[string]bool{}
		ok := true
		for range 3 * n {
			resp, err := client.Get(url)
			if err != nil {
				last, ok = err.Error(), false
				break
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
			resp.Body.Close()
			last = string(b)
			version, rest, _ := strings.Cut(last, " from ")
			if version != want {
				ok = false
				break
			}
			from[strings.Fields(rest + " ?")[0]] = true
		}
		if ok && len(from) >= n {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer %s from %d instances within %s (last: %q)", url, want, n, timeout, last)
}
