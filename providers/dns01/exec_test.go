package dns01

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The exec tests run this test binary as the hook: TestMain hands over to
// testHook when the hook's configured environment says so. The hook is a
// real program receiving a real argv; in "update" mode it does what a real
// hook does, an RFC 2136 update of the test zone.
const hookEnv = "KEEL_DNS01_TEST_HOOK"

func TestMain(m *testing.M) {
	if os.Getenv(hookEnv) == "1" {
		os.Exit(testHook(os.Args[1:]))
	}
	os.Exit(m.Run())
}

type hookRecord struct {
	Args []string
	Env  []string
}

// testHook is the hook's main. HOOK_MODE says what it does.
func testHook(args []string) int {
	if log := os.Getenv("HOOK_LOG"); log != "" && len(args) >= 3 {
		b, _ := json.Marshal(hookRecord{Args: args, Env: os.Environ()})
		_ = os.WriteFile(log+"."+args[len(args)-3], b, 0o600)
	}
	switch os.Getenv("HOOK_MODE") {
	case "update":
		if len(args) < 3 {
			return 2
		}
		action, fqdn, value := args[len(args)-3], args[len(args)-2], args[len(args)-1]
		rr := &dns.TXT{Hdr: dns.RR_Header{Name: fqdn, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{value}}
		m := new(dns.Msg)
		m.SetUpdate(os.Getenv("HOOK_ZONE"))
		if action == "present" {
			m.Insert([]dns.RR{rr})
		} else {
			m.Remove([]dns.RR{rr})
		}
		m.SetTsig(testKeyName, dns.HmacSHA256, 300, time.Now().Unix())
		c := &dns.Client{Net: "tcp", TsigSecret: map[string]string{testKeyName: os.Getenv("HOOK_TSIG_SECRET")}}
		r, _, err := c.Exchange(m, os.Getenv("HOOK_SERVER"))
		if err != nil || r.Rcode != dns.RcodeSuccess {
			fmt.Fprintln(os.Stderr, "update failed:", err)
			return 1
		}
		fmt.Println("updated", fqdn)
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "hook failed; token="+os.Getenv("HOOK_TSIG_SECRET"))
		return 3
	case "spam":
		line := strings.Repeat("x", 1000) + os.Getenv("HOOK_TSIG_SECRET") + "\n"
		for range 100 {
			os.Stdout.WriteString(line)
		}
		return 1
	case "hang":
		// A child that would keep the output pipe open, then hang.
		child := exec.Command(os.Args[0])
		child.Env = []string{hookEnv + "=1", "HOOK_MODE=sleep"}
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			return 4
		}
		_ = os.WriteFile(os.Getenv("HOOK_PIDFILE"), []byte(strconv.Itoa(child.Process.Pid)), 0o600)
		time.Sleep(time.Hour) // killed by the provider's timeout
		return 0
	case "sleep":
		time.Sleep(time.Hour)
		return 0
	}
	return 5
}

func execConfig(t *testing.T, z *testZone, mode, extra string) (config, log string) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	log = filepath.Join(t.TempDir(), "hook")
	config = fmt.Sprintf(`provider: exec
command: [%q, --zone, example.test.]
env:
  %s: "1"
  HOOK_MODE: %s
  HOOK_LOG: %q
  HOOK_SERVER: %q
  HOOK_ZONE: example.test.
  HOOK_TSIG_SECRET: %q
  HOOK_PIDFILE: %q
  GORACE: atexit_sleep_ms=0
%s`, self, hookEnv, mode, log, z.ns[0].addr, testKeySecret, log+".pid", extra) + z.propagationSettings(30*time.Second)
	return config, log
}

func readHookRecord(t *testing.T, path string) hookRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the hook left no record: %v", err)
	}
	var r hookRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// The hook gets the exact argv (its configured arguments, then the action,
// the name and the value), only its configured environment (not the
// agent's), and Present waits until its update is served everywhere.
func TestExecHook(t *testing.T) {
	t.Setenv("KEEL_DNS01_LEAK", "agent-credential-in-env")
	z := newTestZone(t, "example.test", 2)
	cfg, log := execConfig(t, z, "update", "")
	p, err := Load(writeConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const name = "_acme-challenge.www.example.test."
	value := RecordValue("token.thumbprint")
	if err := p.Present(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	rec := readHookRecord(t, log+".present")
	if want := []string{"--zone", "example.test.", "present", name, value}; !slices.Equal(rec.Args, want) {
		t.Errorf("hook argv %q, want %q", rec.Args, want)
	}
	slices.Sort(rec.Env)
	for _, kv := range rec.Env {
		if strings.HasPrefix(kv, "KEEL_DNS01_LEAK=") {
			t.Errorf("the agent's environment leaked to the hook: %s", kv)
		}
	}
	if !slices.Contains(rec.Env, "PATH="+execPath) || !slices.Contains(rec.Env, "HOOK_MODE=update") {
		t.Errorf("hook environment %q lacks PATH or its configured variables", rec.Env)
	}
	if len(rec.Env) != 9 { // the 8 configured + PATH
		t.Errorf("hook environment has %d variables, want 9: %q", len(rec.Env), rec.Env)
	}
	for i := range z.ns {
		if got := z.served(i, name); !slices.Equal(got, []string{value}) {
			t.Errorf("%s serves %q after Present", z.ns[i].name, got)
		}
	}

	if err := p.CleanUp(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if rec := readHookRecord(t, log+".cleanup"); !slices.Equal(rec.Args, []string{"--zone", "example.test.", "cleanup", name, value}) {
		t.Errorf("hook argv %q for cleanup", rec.Args)
	}
	if got := z.served(0, name); len(got) != 0 {
		t.Errorf("ns1 serves %q after CleanUp", got)
	}
}

// A failing hook: the exit status is in the error; its output only with
// errorOutput, bounded, and with the configured credentials blanked out.
func TestExecHookFailure(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	for _, tc := range []struct {
		name, mode, extra string
		want, notWant     []string
		maxLen            int
	}{
		{"exit status", "fail", "", []string{"exit status 3"}, []string{"hook failed"}, 1000},
		{"with output", "fail", "errorOutput: true\n", []string{"exit status 3", "hook failed; token=[redacted]"}, nil, 1000},
		{"bounded output", "spam", "errorOutput: true\n", []string{"exit status 1", "more bytes]"}, nil, execOutputMax + 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := execConfig(t, z, tc.mode, tc.extra)
			p, err := Load(writeConfig(t, cfg))
			if err != nil {
				t.Fatal(err)
			}
			err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
			if err == nil {
				t.Fatal("Present succeeded with a failing hook")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %.300q lacks %q", err, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %.300q has %q", err, w)
				}
			}
			if len(err.Error()) > tc.maxLen {
				t.Errorf("error is %d bytes long", len(err.Error()))
			}
			noSecret(t, err, testKeySecret)
		})
	}
}

// A hook that hangs is killed at the timeout, with the children it
// started (its process group).
func TestExecHookTimeout(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	cfg, log := execConfig(t, z, "hang", "timeout: 3s\n")
	p, err := Load(writeConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "killed after the 3s timeout") {
		t.Fatalf("Present = %v, want the hook killed at its timeout", err)
	}
	if errors.Is(err, ErrNotVisible) {
		t.Errorf("a hook timeout is reported as a propagation timeout: %v", err)
	}
	b, err := os.ReadFile(log + ".pid")
	if err != nil {
		t.Fatalf("the hook did not start its child within 3s: %v", err)
	}
	pid, _ := strconv.Atoi(string(b))
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the hook's child %d outlived the hook's timeout", pid)
		}
		time.Sleep(10 * time.Millisecond) // poll until the kernel has torn it down
	}
}

// alive reports whether pid is a process that is not a zombie (a killed
// child reparented to a PID 1 that does not reap stays a zombie).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) || !dirExists("/proc/self")
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// A program that does not exist: a clear error at Present.
func TestExecHookMissingProgram(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	cfg := "provider: exec\ncommand: [/nonexistent/keel-dns-hook]\n" + z.propagationSettings(time.Second)
	p, err := Load(writeConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/keel-dns-hook") || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("Present = %v, want the missing program named", err)
	}
}
