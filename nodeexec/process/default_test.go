package process_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/process"
	"github.com/keel-dev/keel/render"
)

// TestDefaultCommandBootsTheImageNotTheHost: a spec without a command runs
// /bin/sh /etc/rc; the process driver must run the image's rc, never the
// host's, and refuse when the image has none.
func TestDefaultCommandBootsTheImageNotTheHost(t *testing.T) {
	state := t.TempDir()
	d, err := process.New(process.Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spec := nodeexec.InstanceSpec{Name: "boot", Node: "n1", Address: netip.MustParseAddr("127.0.0.2"),
		Spec: render.JailSpec{Image: "base/none", Command: render.DefaultCommand}}
	if _, err := d.Start(ctx, spec); err == nil || !strings.Contains(err.Error(), "explicit command") {
		t.Fatalf("started the default command without an image rc: %v", err)
	}
	img := filepath.Join(state, "images", "base", "rc")
	if err := os.MkdirAll(filepath.Join(img, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "etc", "rc"), []byte("echo booted > \"$HOME/booted\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Name, spec.Spec.Image = "boot2", "base/rc"
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(ctx, "boot2", time.Second) })
	root, err := d.RootDir("boot2")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(root, "booted")); err == nil && strings.TrimSpace(string(b)) == "booted" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the image's /etc/rc did not run")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
