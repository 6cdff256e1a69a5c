//go:build unix

package pebble_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/internal/pebble/pebbletest"
)

// TestVersionIsTheGoModPin keeps Version (which names the cached
// binaries) in step with the tool pin go.mod holds.
func TestVersionIsTheGoModPin(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-json", "github.com/letsencrypt/pebble/v2").Output()
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Version string }
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m.Version != pebble.Version {
		t.Fatalf("go.mod pins pebble %s, pebble.Version is %s", m.Version, pebble.Version)
	}
}

func resolver(s *pebble.Server, network string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, s.DNSAddr)
	}}
}

func TestStartServesDirectoryDNSAndStopsForGood(t *testing.T) {
	s := pebbletest.Start(t, pebble.Options{})

	// The directory answers over TLS verified by DirectoryRoots alone.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.DirectoryRoots},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(s.DirectoryURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var dir map[string]any
	if err := json.Unmarshal(body, &dir); err != nil || dir["newOrder"] == nil {
		t.Fatalf("directory %s: %v", body, err)
	}
	if len(s.IssuingRootsPEM) == 0 || s.IssuingRoots == nil || len(s.IntermediatesPEM) == 0 {
		t.Fatal("no issuing roots or intermediates")
	}
	if s.HTTPPort == 0 {
		t.Fatal("no HTTP-01 port picked")
	}

	// DNS answers what the API sets, over UDP and TCP, with no AAAA.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.SetTXT("_acme-challenge.a.example.com", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddA("b.example.com", "127.0.0.9"); err != nil {
		t.Fatal(err)
	}
	for _, network := range []string{"udp", "tcp"} {
		r := resolver(s, network)
		txt, err := r.LookupTXT(ctx, "_acme-challenge.a.example.com.")
		if err != nil || len(txt) != 1 || txt[0] != "v1" {
			t.Fatalf("%s: TXT %v %v", network, txt, err)
		}
		addrs, err := r.LookupHost(ctx, "b.example.com.")
		if err != nil || len(addrs) != 1 || addrs[0] != "127.0.0.9" {
			t.Fatalf("%s: A %v %v", network, addrs, err)
		}
		addrs, err = r.LookupHost(ctx, "anything.example.com.")
		if err != nil || len(addrs) != 1 || addrs[0] != "127.0.0.1" {
			t.Fatalf("%s: default A %v %v", network, addrs, err)
		}
	}
	if err := s.ClearTXT("_acme-challenge.a.example.com"); err != nil {
		t.Fatal(err)
	}
	if txt, err := resolver(s, "tcp").LookupTXT(ctx, "_acme-challenge.a.example.com."); err == nil {
		t.Fatalf("TXT still answered after ClearTXT: %v", txt)
	}
	if err := s.SetDefaultIPv4("127.0.0.7"); err != nil {
		t.Fatal(err)
	}
	if addrs, err := resolver(s, "udp").LookupHost(ctx, "c.example.com."); err != nil || addrs[0] != "127.0.0.7" {
		t.Fatalf("default A after SetDefaultIPv4: %v %v", addrs, err)
	}

	pids := pidsOf(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still there after Close: %v", pid, err)
		}
	}
	if _, err := client.Get(s.DirectoryURL); err == nil {
		t.Error("the directory still answers after Close")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// pidsOf finds the two processes by their logs' directory: they run with
// it as their working directory.
func pidsOf(t *testing.T, s *pebble.Server) []int {
	t.Helper()
	dir := s.PebbleLog[:strings.LastIndex(s.PebbleLog, "/")]
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc to find the children in")
	}
	var pids []int
	for _, e := range ents {
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || cwd != dir {
			continue
		}
		var pid int
		if err := json.Unmarshal([]byte(e.Name()), &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		t.Fatalf("found %d processes running in %s, want 2", len(pids), dir)
	}
	return pids
}

// TestTwoServersSideBySide: two Pebbles of one test process get ports
// of their own, and a given HTTP-01 port is used as given.
func TestTwoServersSideBySide(t *testing.T) {
	a := pebbletest.Start(t, pebble.Options{})
	b := pebbletest.Start(t, pebble.Options{HTTPPort: a.HTTPPort})
	if a.DirectoryURL == b.DirectoryURL || a.DNSAddr == b.DNSAddr {
		t.Fatalf("two servers share an address: %s %s", a.DirectoryURL, b.DirectoryURL)
	}
	if b.HTTPPort != a.HTTPPort {
		t.Fatalf("HTTPPort %d, want the given %d", b.HTTPPort, a.HTTPPort)
	}
	if string(a.IssuingRootsPEM) == string(b.IssuingRootsPEM) {
		t.Fatal("two Pebbles with one root")
	}
}
