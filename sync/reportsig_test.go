package sync_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

func TestSignedReports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	n1Key, n1Pub := sshKey(t, dir, "n1")
	evilKey, _ := sshKey(t, dir, "evil")
	signer, err := sync.LoadReportSigner(n1Key)
	if err != nil {
		t.Fatal(err)
	}
	evil, err := sync.LoadReportSigner(evilKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(n1Pub))
	if err != nil {
		t.Fatal(err)
	}
	keys := sync.ReportKeys{"n1": pub}
	bare, _ := server(t)
	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	r := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC), AgentVersion: "x"}
	read := func() ([]report.Report, []string) {
		m2, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, render.DefaultReportRefPrefix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m2.Fetch(ctx); err != nil {
			t.Fatal(err)
		}
		reports, problems, err := m2.Reports(keys)
		if err != nil {
			t.Fatal(err)
		}
		return reports, problems
	}
	publish := func(s ssh.Signer) {
		data := r.Marshal()
		var sig []byte
		if s != nil {
			if sig, err = sync.SignReport(data, s); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := m.PublishSigned(ctx, "n1", data, sig, r.Time); err != nil {
			t.Fatal(err)
		}
	}

	publish(signer)
	if reports, problems := read(); len(reports) != 1 || len(problems) != 0 {
		t.Fatalf("a report signed by the node's key: %v %v", reports, problems)
	}
	for name, s := range map[string]ssh.Signer{"unsigned": nil, "signed by another key": evil} {
		r.AgentVersion = name
		publish(s)
		reports, problems := read()
		if len(reports) != 0 || len(problems) != 1 {
			t.Errorf("%s: %v %v", name, reports, problems)
		}
	}
	// Without keys, the same report counts (a node without reportKey).
	keys = nil
	if reports, _ := read(); len(reports) != 1 {
		t.Error("an unsigned report of a node without a key was refused")
	}
	// A commit signature never passes for a report signature: namespaces.
	sig, _ := sync.SignReport([]byte("x"), signer)
	if err := sync.VerifyReport([]byte("x"), sig, pub); err != nil {
		t.Fatal(err)
	}
	if err := sync.VerifyReport([]byte("y"), sig, pub); err == nil || !strings.Contains(err.Error(), "bad signature") {
		t.Fatalf("a signature over other bytes passed: %v", err)
	}
}
