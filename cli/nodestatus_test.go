package cli_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/report"
)

// Issue 9: keel node status shows the node's host problems, each with its
// fix, from the agent's local API (served here on a real Unix socket).
func TestNodeStatusShowsHostProblems(t *testing.T) {
	dir, err := os.MkdirTemp("", "keel") // short: a socket path has a length limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "keel.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	st := agent.Status{Applied: "0123456789abcdef", GitOK: true, Report: report.Report{
		Node: "fra1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC),
		Problems: []report.Problem{{Check: report.CheckRacct, Problem: "resource accounting is off: instances with limits are refused",
			Fix: "echo kern.racct.enable=1 >> /boot/loader.conf, then reboot"}},
	}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	code, out, errOut := keel(t, "node", "status", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "HOST PROBLEM racct: resource accounting is off: instances with limits are refused; fix: echo kern.racct.enable=1 >> /boot/loader.conf, then reboot\n"
	if !strings.Contains(out, want) {
		t.Errorf("keel node status lacks %q:\n%s", want, out)
	}
	code, out, _ = keel(t, "node", "status", "--socket", sock, "--format", "yaml")
	if code != 0 || !strings.Contains(out, "problems:\n  - check: racct\n") {
		t.Errorf("yaml status lacks the problems (exit %d):\n%s", code, out)
	}
}
