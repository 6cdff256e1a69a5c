package freebsd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	rcScript      = "rc.d/keel"
	syslogConf    = "syslog.d/keel.conf"
	newsyslogConf = "newsyslog.conf.d/keel.conf"
	stubRCSubr    = "testdata/rc.subr"
)

// shells returns the POSIX shells the script is run with: /bin/sh (the
// real one on FreeBSD, dash on Debian: both descend from ash), and dash
// and bash in POSIX mode when they are installed elsewhere. Each is an
// argv prefix.
func shells(t *testing.T) [][]string {
	t.Helper()
	var out [][]string
	seen := map[string]bool{}
	add := func(path string, args ...string) {
		real, err := filepath.EvalSymlinks(path)
		if err != nil || seen[real] {
			return
		}
		seen[real] = true
		out = append(out, append([]string{path}, args...))
	}
	add("/bin/sh")
	if p, err := exec.LookPath("dash"); err == nil {
		add(p)
	}
	if p, err := exec.LookPath("bash"); err == nil {
		add(p, "--posix")
	}
	if len(out) == 0 {
		t.Fatal("no POSIX shell: /bin/sh is missing")
	}
	return out
}

func shellName(sh []string) string { return filepath.Base(sh[0]) }

// TestRCScriptSyntax: every shell parses the script (sh -n).
func TestRCScriptSyntax(t *testing.T) {
	for _, sh := range shells(t) {
		t.Run(shellName(sh), func(t *testing.T) {
			cmd := exec.Command(sh[0], append(sh[1:], "-n", rcScript)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v -n %s: %v\n%s", sh, rcScript, err, out)
			}
		})
	}
}

// rcSubrReserved are the ${name}_<suffix> variables that rc.subr itself
// reads in run_rc_command (libexec/rc/rc.subr: _rc_namevarlist, and the
// evals of _cpuset, _login_class, _limits, _oomprotect, _umask, _env_file,
// _svcj*, _offcmd). A script variable with one of these names changes
// what rc.subr runs, whatever the script means by it
// (docs/freebsd-notes.md §8.4).
var rcSubrReserved = []string{
	"program", "chroot", "chdir", "env", "flags", "fib", "nice", "user",
	"group", "groups", "prepend", "setup", "cpuset", "login_class", "limits",
	"oomprotect", "umask", "env_file", "svcj", "svcj_options",
	"svcj_ipaddrs", "offcmd",
}

// TestRCScriptVariables: the header documents exactly the keel_*
// variables the script reads, and the only ones that rc.subr also reads
// are those the script handles: keel_enable (the rcvar), keel_flags
// (moved behind the agent's flags), keel_user (refused unless root).
func TestRCScriptVariables(t *testing.T) {
	src, err := os.ReadFile(rcScript)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	used := map[string]bool{}
	docLine := regexp.MustCompile(`^# (keel_[a-z_]+) \((bool|str)\):`)
	ref := regexp.MustCompile(`\$\{?(keel_[a-z_]+)`)
	for line := range strings.Lines(string(src)) {
		line = strings.TrimRight(line, "\n")
		if m := docLine.FindStringSubmatch(line); m != nil {
			documented[m[1]] = true
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range ref.FindAllStringSubmatch(line, -1) {
			used[m[1]] = true
		}
	}
	// rc.subr reads keel_flags itself, into rc_flags.
	used["keel_flags"] = true

	for v := range used {
		if !documented[v] {
			t.Errorf("the script reads %s, which its header does not document", v)
		}
	}
	for v := range documented {
		if !used[v] {
			t.Errorf("the header documents %s, which the script never reads", v)
		}
	}
	handled := map[string]bool{"keel_enable": true, "keel_flags": true, "keel_user": true}
	for v := range documented {
		for _, s := range rcSubrReserved {
			if v == "keel_"+s && !handled[v] {
				t.Errorf("%s is rc.subr's own ${name}_%s: rename it", v, s)
			}
		}
	}
	if len(documented) < 10 {
		t.Errorf("only %d variables documented: the header's format changed? %v", len(documented), documented)
	}
}

// runResult is what one `rc.d/keel start` under the stub rc.subr printed.
type runResult struct {
	argv    []string // the command rc.subr would eval, as argv
	modules []string // required_modules, in order
	stdout  string   // anything else on stdout
	stderr  string
	err     error
}

// runStart runs `rc.d/keel start` with shell sh, the stub rc.subr in place
// of /etc/rc.subr, and rcConf as /etc/rc.conf, in directory dir (so that a
// value that escaped its quoting and ran a command would leave a file
// there). env is added to a minimal environment.
func runStart(t *testing.T, sh []string, dir, rcConf string, env ...string) runResult {
	t.Helper()
	src, err := os.ReadFile(rcScript)
	if err != nil {
		t.Fatal(err)
	}
	stub, err := filepath.Abs(stubRCSubr)
	if err != nil {
		t.Fatal(err)
	}
	// The one line that loads rc.subr, replaced by the stub.
	const load = ". /etc/rc.subr\n"
	if n := strings.Count(string(src), load); n != 1 {
		t.Fatalf("%s loads /etc/rc.subr %d times, want once", rcScript, n)
	}
	script := filepath.Join(t.TempDir(), "keel")
	body := strings.Replace(string(src), load, ". '"+stub+"'\n", 1)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "rc.conf")
	if err := os.WriteFile(conf, []byte(rcConf), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(sh[0], append(sh[1:], script, "start")...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=/", "KEEL_TEST_RC_CONF=" + conf}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	res := runResult{err: cmd.Run(), stderr: stderr.String()}

	var rest []string
	for rec := range strings.SplitSeq(stdout.String(), "\x00") {
		switch {
		case strings.HasPrefix(rec, "argv="):
			res.argv = append(res.argv, strings.TrimPrefix(rec, "argv="))
		case strings.HasPrefix(rec, "kld="):
			res.modules = append(res.modules, strings.TrimPrefix(rec, "kld="))
		case rec != "":
			rest = append(rest, rec)
		}
	}
	res.stdout = strings.Join(rest, "")
	return res
}

// daemonInvocation is daemon(8)'s reading of its argv.
type daemonInvocation struct {
	closeFDs, restart, syslog bool
	restartDelay              string
	supervisorPid, childPid   string
	syslogTag, title, user    string
	outputFile, priority, fac string
	command                   []string
}

// parseDaemon reads argv the way daemon(8) does: getopt_long with
// shortopts "+cfHSp:P:ru:o:s:l:t:m:R:T:h" (usr.sbin/daemon/daemon.c). The
// leading "+" stops at the first non-option; "--" ends the options and is
// dropped. Short options only: the script uses no long ones.
func parseDaemon(argv []string) (daemonInvocation, error) {
	var d daemonInvocation
	if len(argv) == 0 || argv[0] != "/usr/sbin/daemon" {
		return d, fmt.Errorf("command is %q, want /usr/sbin/daemon", argv)
	}
	const withArg = "pPuosltmRT"
	const noArg = "cfHSrh"
	i := 1
	for ; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' || strings.HasPrefix(a, "--") {
			if strings.HasPrefix(a, "--") {
				return d, fmt.Errorf("daemon: long option %q before the command", a)
			}
			break
		}
		for j := 1; j < len(a); j++ {
			c := a[j]
			switch {
			case strings.IndexByte(noArg, c) >= 0:
				switch c {
				case 'c':
				case 'f':
					d.closeFDs = true
				case 'H':
				case 'S':
					d.syslog = true
				case 'r':
					d.restart = true
				case 'h':
					return d, errors.New("daemon: -h prints usage")
				}
			case strings.IndexByte(withArg, c) >= 0:
				var v string
				if j+1 < len(a) {
					v = a[j+1:]
				} else {
					i++
					if i >= len(argv) {
						return d, fmt.Errorf("daemon: -%c needs an argument", c)
					}
					v = argv[i]
				}
				switch c {
				case 'p':
					d.childPid = v
				case 'P':
					d.supervisorPid = v
				case 'u':
					d.user = v
				case 'o':
					d.outputFile = v
				case 's':
					d.priority, d.syslog = v, true
				case 'l':
					d.fac, d.syslog = v, true
				case 't':
					d.title = v
				case 'm':
				case 'R':
					d.restartDelay, d.restart = v, true
				case 'T':
					d.syslogTag, d.syslog = v, true
				}
				j = len(a)
			default:
				return d, fmt.Errorf("daemon: unknown option -%c in %q", c, a)
			}
		}
	}
	d.command = argv[i:]
	if len(d.command) == 0 {
		return d, errors.New("daemon: no command")
	}
	return d, nil
}

// checkDaemon asserts what every start must give daemon(8): supervision
// with the supervisor's pidfile where rc.subr looks for it, restart,
// /dev/null stdio, syslog tagged keel, and `<keel> agent --driver
// freebsd` as the command.
func checkDaemon(t *testing.T, argv []string, bin string) {
	t.Helper()
	d, err := parseDaemon(argv)
	if err != nil {
		t.Fatalf("daemon(8) would refuse %q: %v", argv, err)
	}
	if d.supervisorPid != "/var/run/keel.pid" || d.childPid != "" {
		t.Errorf("pidfiles: -P %q -p %q, want -P /var/run/keel.pid only (docs/freebsd-notes.md §8.2)", d.supervisorPid, d.childPid)
	}
	if !d.restart || !d.closeFDs || !d.syslog || d.syslogTag != "keel" || d.user != "" || d.outputFile != "" {
		t.Errorf("daemon options %+v: want -f -r -S -T keel and no -u or -o", d)
	}
	if want := []string{bin, "agent", "--driver", "freebsd"}; !slices.Equal(d.command[:min(4, len(d.command))], want) {
		t.Errorf("daemon runs %q, want it to start with %q", d.command, want)
	}
}

// daemonPrefix is the argv up to the keel binary, the same for every start.
var daemonPrefix = []string{"/usr/sbin/daemon", "-f", "-r", "-R", "5", "-P", "/var/run/keel.pid", "-S", "-T", "keel", "--"}

// TestRCScriptArgv runs `rc.d/keel start` for several rc.conf settings and
// checks the exact argv it has rc.subr run, and the modules it loads.
func TestRCScriptArgv(t *testing.T) {
	etc := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(etc, name)
		if err := os.WriteFile(p, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bin := filepath.Join(etc, "keel")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	id, kh, tok, rk, signers := file("id_ed25519"), file("known_hosts"), file("token"), file("report_key"), file("allowed_signers")
	// A path with every character that an unquoted or double-quoted
	// value would turn into something else.
	weird := filepath.Join(etc, `it's "my" $(touch pwned) `+"`touch pwned2`"+` $HOME * dir`)
	if err := os.WriteFile(weird, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		conf    string
		env     []string
		agent   []string // the argv after daemonPrefix and the binary
		modules []string
	}{
		{
			name: "ssh repository, defaults",
			conf: `keel_enable="YES"
keel_node="fra1"
keel_repo="ssh://git@git.example.com/infra/cluster.git"
keel_identity="` + id + `"
keel_known_hosts="` + kh + `"
keel_bin="` + bin + `"
`,
			agent: []string{"agent", "--driver", "freebsd", "--node", "fra1",
				"--repo", "ssh://git@git.example.com/infra/cluster.git", "--state-dir", "/var/db/keel",
				"--ssh-key", id, "--known-hosts", kh, "--metrics-listen", "127.0.0.1:9273"},
			modules: []string{"if_bridge", "if_epair"},
		},
		{
			name: "every variable set",
			conf: `keel_enable="yes"
keel_node="fra2"
keel_repo="https://git.example.com/infra/cluster.git"
keel_state_dir="/keel/state"
keel_pool="tank"
keel_bridge="keel1"
keel_public_iface="vtnet0"
keel_token_file="` + tok + `"
keel_report_key="` + rk + `"
keel_allowed_signers="` + signers + `"
keel_metrics_listen=":9273"
keel_flags="--poll 30s --log-format json"
keel_bin="` + bin + `"
`,
			agent: []string{"agent", "--driver", "freebsd", "--node", "fra2",
				"--repo", "https://git.example.com/infra/cluster.git", "--state-dir", "/keel/state",
				"--pool", "tank", "--bridge", "keel1", "--public-iface", "vtnet0",
				"--token-file", tok, "--report-key", rk,
				"--verify-signatures", "--allowed-signers", signers,
				"--metrics-listen", ":9273", "--poll", "30s", "--log-format", "json"},
			modules: []string{"if_bridge", "if_epair", "pf"},
		},
		{
			name: "values with spaces, quotes, $ and globs stay one argument each; empty metrics address serves none",
			conf: `keel_enable=YES
keel_node=fra3
keel_repo='/srv/git/it'\''s "my" $(touch pwned) ` + "`touch pwned2`" + ` $HOME *.git'
keel_state_dir="/var/db/keel state"
keel_identity='` + strings.ReplaceAll(weird, `'`, `'\''`) + `'
keel_known_hosts="` + kh + `"
keel_metrics_listen=""
keel_pool=""
keel_bin="` + bin + `"
`,
			agent: []string{"agent", "--driver", "freebsd", "--node", "fra3",
				"--repo", `/srv/git/it's "my" $(touch pwned) ` + "`touch pwned2`" + ` $HOME *.git`,
				"--state-dir", "/var/db/keel state", "--ssh-key", weird, "--known-hosts", kh},
			modules: []string{"if_bridge", "if_epair"},
		},
		{
			name: "keel_flags is split by the shell and its quotes are honoured",
			conf: `keel_enable=YES
keel_node=fra1
keel_repo=/srv/git/cluster.git
keel_metrics_listen=
keel_flags="--webhook-listen :9274 --webhook-secret-file '/usr/local/etc/keel/web hook'"
keel_bin="` + bin + `"
`,
			agent: []string{"agent", "--driver", "freebsd", "--node", "fra1",
				"--repo", "/srv/git/cluster.git", "--state-dir", "/var/db/keel",
				"--webhook-listen", ":9274", "--webhook-secret-file", "/usr/local/etc/keel/web hook"},
			modules: []string{"if_bridge", "if_epair"},
		},
		{
			name: "flags in the environment replace keel_flags, behind the agent's flags too",
			conf: `keel_enable=YES
keel_node=fra1
keel_repo=/srv/git/cluster.git
keel_flags="--poll 30s"
keel_bin="` + bin + `"
`,
			env: []string{"flags=--log-level debug"},
			agent: []string{"agent", "--driver", "freebsd", "--node", "fra1",
				"--repo", "/srv/git/cluster.git", "--state-dir", "/var/db/keel",
				"--metrics-listen", "127.0.0.1:9273", "--log-level", "debug"},
			modules: []string{"if_bridge", "if_epair"},
		},
	}
	for _, sh := range shells(t) {
		for _, tc := range tests {
			t.Run(shellName(sh)+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				res := runStart(t, sh, dir, tc.conf, tc.env...)
				if res.err != nil {
					t.Fatalf("start: %v\nstdout: %s\nstderr: %s", res.err, res.stdout, res.stderr)
				}
				if res.stderr != "" || res.stdout != "" {
					t.Errorf("start printed stdout %q, stderr %q", res.stdout, res.stderr)
				}
				want := append(append(slices.Clone(daemonPrefix), bin), tc.agent...)
				if !slices.Equal(res.argv, want) {
					t.Errorf("argv:\n got %q\nwant %q", res.argv, want)
				}
				checkDaemon(t, res.argv, bin)
				if !slices.Equal(res.modules, tc.modules) {
					t.Errorf("required_modules %q, want %q", res.modules, tc.modules)
				}
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("a value ran as a command: %v in the working directory", entries)
				}
			})
		}
	}
}

// TestRCScriptRefuses: a start with a missing or wrong setting fails in
// start_precmd, with a message naming the setting, and runs nothing.
func TestRCScriptRefuses(t *testing.T) {
	etc := t.TempDir()
	bin := filepath.Join(etc, "keel")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := "keel_enable=YES\nkeel_node=fra1\nkeel_repo=/srv/git/cluster.git\nkeel_bin=" + bin + "\n"
	tests := []struct {
		name, conf, want string
	}{
		{"no node", "keel_enable=YES\nkeel_repo=/srv/git/cluster.git\nkeel_bin=" + bin + "\n", "set keel_node"},
		{"no repository", "keel_enable=YES\nkeel_node=fra1\nkeel_bin=" + bin + "\n", "set keel_repo"},
		{"a user other than root", base + "keel_user=keel\n", "keel_user=keel: the agent runs as root"},
		{"keel_program, which would replace daemon(8)", base + "keel_program=" + bin + "\n", "keel_program replaces daemon(8)"},
		{"no binary at the default path", "keel_enable=YES\nkeel_node=fra1\nkeel_repo=/srv/git/cluster.git\n", "/usr/local/bin/keel is not an executable file"},
		{"an unreadable deploy key", base + "keel_identity=" + filepath.Join(etc, "missing") + "\n", "cannot read " + filepath.Join(etc, "missing")},
		{"a deploy key without known_hosts", base + "keel_identity=" + bin + "\nkeel_known_hosts=" + filepath.Join(etc, "nokh") + "\n", "cannot read " + filepath.Join(etc, "nokh") + " (keel_known_hosts)"},
	}
	for _, sh := range shells(t) {
		for _, tc := range tests {
			t.Run(shellName(sh)+"/"+tc.name, func(t *testing.T) {
				res := runStart(t, sh, t.TempDir(), tc.conf)
				if res.err == nil {
					t.Fatalf("start succeeded with argv %q, want a refusal", res.argv)
				}
				if res.argv != nil {
					t.Errorf("it would still run %q", res.argv)
				}
				if !strings.Contains(res.stderr, "ERROR: "+tc.want) {
					t.Errorf("stderr %q, want it to contain %q", res.stderr, "ERROR: "+tc.want)
				}
			})
		}
	}
	t.Run("disabled", func(t *testing.T) {
		res := runStart(t, shells(t)[0], t.TempDir(), "keel_enable=NO\nkeel_node=fra1\nkeel_repo=/srv/git/cluster.git\nkeel_bin="+bin+"\n")
		if res.err != nil || res.argv != nil || !strings.Contains(res.stdout, "Set keel_enable to YES") {
			t.Errorf("keel_enable=NO: err %v, argv %q, stdout %q; want no start and rc.subr's hint", res.err, res.argv, res.stdout)
		}
	})
}

// TestLogFilesAgree: the syslog tag the script gives daemon(8), the
// program the syslog.d example selects, and the file it writes are the
// ones the newsyslog example rotates.
func TestLogFilesAgree(t *testing.T) {
	read := func(p string) []string {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var lines []string
		s := bufio.NewScanner(f)
		for s.Scan() {
			if l := strings.TrimSpace(s.Text()); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		return lines
	}
	syslog := read(syslogConf)
	if len(syslog) != 2 || syslog[0] != "!keel" {
		t.Fatalf("%s: want `!keel` and one selector line, got %q", syslogConf, syslog)
	}
	sel := strings.Fields(syslog[1])
	if len(sel) != 2 || sel[0] != "*.*" || !strings.HasPrefix(sel[1], "/var/log/") {
		t.Fatalf("%s: selector line %q", syslogConf, syslog[1])
	}
	logFile := sel[1]

	// newsyslog.conf(5): logfilename [owner:group] mode count size when flags [/pid_file] [sig_num]
	rot := read(newsyslogConf)
	if len(rot) != 1 {
		t.Fatalf("%s: want one entry, got %q", newsyslogConf, rot)
	}
	f := strings.Fields(rot[0])
	if len(f) != 6 || f[0] != logFile || !regexp.MustCompile(`^[0-7]{3}$`).MatchString(f[1]) || !strings.Contains(f[5], "C") {
		t.Errorf("%s: entry %q: want `%s mode count size when flags` with flag C and no pid_file (syslogd is signalled)", newsyslogConf, rot[0], logFile)
	}

	src, err := os.ReadFile(rcScript)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), `-S -T "${name}"`) || !strings.Contains(string(src), `name="keel"`) {
		t.Errorf("%s: want daemon's syslog tag to be the script's name, keel", rcScript)
	}
}
