package freebsd_test

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/render"
)

var update = flag.Bool("update", false, "rewrite the transcripts in testdata/transcripts")

// The transcript tests pin the exact argv sequence the driver runs for a
// scenario, against testdata/transcripts/<name>.txt (rewritten by -update
// after checking the change): one command a line, the argv's elements
// separated by spaces (quoted when they hold one), "start:" before the
// workloads started with Runner.Start, and "# ..." lines between the
// steps of the scenario.

type transcript struct {
	t *testing.T
	h *host
	b strings.Builder
}

func newTranscript(t *testing.T, h *host) *transcript {
	h.rec.take() // what New ran
	return &transcript{t: t, h: h}
}

// step records the commands run by fn under a heading.
func (tr *transcript) step(title string, fn func()) [][]string {
	tr.t.Helper()
	fn()
	cmds := tr.h.rec.take()
	tr.b.WriteString("# " + title + "\n")
	for _, argv := range cmds {
		tr.b.WriteString(formatArgv(argv) + "\n")
	}
	return cmds
}

func formatArgv(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\") {
			a = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`).Replace(a) + `"`
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// check compares the transcript with its golden file.
func (tr *transcript) check(name string) {
	tr.t.Helper()
	path := filepath.Join("testdata", "transcripts", name+".txt")
	got := tr.b.String()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tr.t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			tr.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tr.t.Fatalf("%v (run go test ./nodeexec/freebsd -run %s -update to create it)", err, tr.t.Name())
	}
	if got != string(want) {
		tr.t.Errorf("the commands differ from %s (run with -update after checking the change):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// changing reports the commands of cmds that change the host: anything
// but the reads the driver makes (jls, ps, zfs list/get, mount -p, ifconfig
// <if>, rctl <filter>, sysctl -n, pfctl -s).
func changing(cmds [][]string) []string {
	var out []string
	for _, argv := range cmds {
		read := false
		switch argv[0] {
		case "jls", "ps":
			read = true
		case "zfs":
			read = argv[1] == "list" || argv[1] == "get"
		case "mount":
			read = len(argv) == 2 && argv[1] == "-p"
		case "ifconfig":
			read = len(argv) == 2
		case "rctl":
			read = len(argv) == 2 && !strings.HasPrefix(argv[1], "-")
		case "sysctl":
			read = argv[1] == "-n" && !strings.Contains(argv[2], "=")
		case "pfctl":
			read = argv[1] == "-s"
		}
		if !read {
			out = append(out, formatArgv(argv))
		}
	}
	return out
}

// webSpec is the scenario's instance: a vnet jail on keel0 at 10.0.60.5
// with two volumes and limits.
func webSpec(t *testing.T, d *freebsd.Driver) nodeexec.InstanceSpec {
	t.Helper()
	spec := nodeexec.InstanceSpec{
		Name:     "web-0",
		Service:  "web",
		Node:     "n1",
		Address:  netip.MustParseAddr("10.0.60.5"),
		SpecHash: "h1",
		Spec: render.JailSpec{
			Image:   "base/test",
			Command: []string{"/bin/sh", "-c", "exec sleep 300 # $KEEL_INSTANCE"},
			Env:     map[string]string{"GREETING": "hello world"},
			Network: render.Network{VNet: true, Bridge: "keel0"},
			Resources: render.Resources{
				CPU:    1500,
				Memory: 256 << 20,
			},
			RestartPolicy: "Always",
			Volumes: []render.Volume{
				{Name: "web-0-data", MountPath: "/var/db/web", Size: 1 << 30},
				{Name: "web-0-cache", MountPath: "/var/cache"},
			},
		},
		Volumes: map[string]string{},
	}
	return spec
}

// ensureVolumes creates the spec's volumes, as the reconciler does before
// Start.
func ensureVolumes(t *testing.T, d *freebsd.Driver, spec *nodeexec.InstanceSpec) {
	t.Helper()
	for _, v := range spec.Spec.Volumes {
		p, err := d.EnsureVolume(t.Context(), v.Name, v.Size)
		if err != nil {
			t.Fatal(err)
		}
		spec.Volumes[v.Name] = p
	}
}

// pass is what the reconciler asks of the driver for a running instance
// each pass.
func pass(t *testing.T, d *freebsd.Driver, spec nodeexec.InstanceSpec) {
	t.Helper()
	ctx := t.Context()
	if r, err := d.Running(ctx); err != nil || r[spec.Name].SpecHash != spec.SpecHash {
		t.Fatalf("Running = %+v, %v", r, err)
	}
	for _, v := range spec.Spec.Volumes {
		if _, err := d.EnsureVolume(ctx, v.Name, v.Size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Start(ctx, spec); !errors.Is(err, nodeexec.ErrAlreadyRunning) {
		t.Fatalf("Start of a running instance: %v, want ErrAlreadyRunning", err)
	}
	if err := d.Apply(ctx, spec.Name, spec.Spec.Resources); err != nil {
		t.Fatal(err)
	}
}

func TestTranscriptLifecycle(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	tr := newTranscript(t, h)
	spec := webSpec(t, d)

	tr.step("provision a vnet jail with two volumes and limits (docs/freebsd-notes.md §1.9)", func() {
		ensureVolumes(t, d, &spec)
		if _, err := d.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
	})
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
	st := h.sim.State()
	if j := st.Jail("keel-web-0"); j == nil || !j.VNet || j.DevfsRuleset != 4 || !j.Persist {
		t.Errorf("jail = %+v, want vnet, devfs_ruleset 4, persist", j)
	}

	rerun := tr.step("the next pass: nothing changes", func() { pass(t, d, spec) })
	if c := changing(rerun); len(c) > 0 {
		t.Errorf("a pass over a running instance ran commands that change the host:\n%s", strings.Join(c, "\n"))
	}

	spec.Spec.Resources.CPU = 2000
	tr.step("a live resources change: only the pcpu rule is replaced", func() {
		if err := d.Apply(ctx, spec.Name, spec.Spec.Resources); err != nil {
			t.Fatal(err)
		}
	})

	tr.step("stop", func() {
		if err := d.Stop(ctx, spec.Name, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	if e, ok := d.Exited(spec.Name); !ok || !e.Known || e.Code != -1 {
		t.Errorf("Exited = %+v, %v; want a known exit by a signal", e, ok)
	}
	tr.step("start again: the jail, root, volumes and network are there", func() {
		if _, err := d.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
	})
	tr.step("stop and delete (docs/freebsd-notes.md §1.8)", func() {
		if err := d.Stop(ctx, spec.Name, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := d.Destroy(ctx, spec.Name); err != nil {
			t.Fatal(err)
		}
	})
	h.leaks(t, fbsdsim.Expect{})
	st = h.sim.State()
	for _, v := range []string{"zroot/keel/volumes/web-0-data", "zroot/keel/volumes/web-0-cache"} {
		if st.Datasets[v] == nil {
			t.Errorf("volume %s was destroyed with its instance", v)
		}
	}
	tr.check("lifecycle")
}

func TestTranscriptFailedProvisionUnwinds(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	tr := newTranscript(t, h)
	spec := webSpec(t, d)
	tr.step("volumes", func() { ensureVolumes(t, d, &spec) })
	// The jail's default route fails, as it did on a real node whose base
	// image lacked /sbin/route (docs/freebsd-notes.md §10.20, §10.21).
	h.sim.FailNext([]string{"jexec", "keel-web-0", "/sbin/route", "add", "default"},
		"jexec: execvp: /sbin/route: No such file or directory\n", 1)
	tr.step("a provision that fails at the default route, and its unwinding", func() {
		if _, err := d.Start(t.Context(), spec); err == nil || !strings.Contains(err.Error(), "/sbin/route") {
			t.Fatalf("Start = %v, want the route failure", err)
		}
	})
	h.leaks(t, fbsdsim.Expect{})
	if _, err := d.Logs(spec.Name, 100); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Logs after an unwound provision: %v, want ErrNotFound", err)
	}
	tr.step("the retry provisions from scratch", func() {
		if _, err := d.Start(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
	})
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
	tr.check("failed-provision")
}

func TestTranscriptRoutes(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	tr := newTranscript(t, h)
	route := func(dest, via string) nodeexec.Route {
		return nodeexec.Route{Dest: netip.MustParsePrefix(dest), Via: netip.MustParseAddr(via)}
	}
	set := func(rs ...nodeexec.Route) {
		t.Helper()
		if err := d.SetRoutes(ctx, rs); err != nil {
			t.Fatal(err)
		}
	}
	// A route the operator added to a subnet Keel will want: Keel must
	// leave it alone, now and when the peer goes.
	if res, err := h.sim.Run(ctx, []string{"route", "add", "-net", "10.0.9.0/24", "192.0.2.1"}); err != nil || res.Code != 0 {
		t.Fatalf("operator's route: %v %s", err, res.Stderr)
	}
	h.rec.take()
	tr.step("two peers come", func() { set(route("10.0.7.0/24", "192.0.2.7"), route("10.0.8.0/24", "192.0.2.8")) })
	if c := changing(tr.step("the same again: nothing changes", func() {
		set(route("10.0.7.0/24", "192.0.2.7"), route("10.0.8.0/24", "192.0.2.8"))
	})); len(c) > 0 {
		t.Errorf("the same routes again ran %q", c)
	}
	tr.step("one peer goes, one moves to a new address, one whose subnet the operator routes comes", func() {
		set(route("10.0.8.0/24", "192.0.2.88"), route("10.0.9.0/24", "192.0.2.9"))
	})
	h.leaks(t, fbsdsim.Expect{Routes: []string{"10.0.8.0/24", "10.0.9.0/24"}})
	tr.step("every peer goes: the operator's route stays", func() { set() })
	h.leaks(t, fbsdsim.Expect{Routes: []string{"10.0.9.0/24"}})
	tr.check("routes")
}

func TestTranscriptVIPs(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	tr := newTranscript(t, h)
	set := func(vips ...string) {
		t.Helper()
		var as []netip.Addr
		for _, v := range vips {
			as = append(as, netip.MustParseAddr(v))
		}
		if err := d.SetVIPs(ctx, as); err != nil {
			t.Fatal(err)
		}
	}
	tr.step("two VIPs: the bridge is created, then a /32 alias each", func() { set("10.96.0.10", "10.96.0.11") })
	h.leaks(t, fbsdsim.Expect{VIPs: []string{"10.96.0.10", "10.96.0.11"}})
	if c := changing(tr.step("the same again: nothing changes", func() { set("10.96.0.11", "10.96.0.10") })); len(c) > 0 {
		t.Errorf("the same VIPs again ran %q", c)
	}
	tr.step("one goes", func() { set("10.96.0.11") })
	tr.step("none", func() { set() })
	h.leaks(t, fbsdsim.Expect{})
	if st := h.sim.State(); st.Iface("", "keel0") == nil {
		t.Errorf("the bridge was destroyed")
	}
	tr.check("vips")
}

func TestTranscriptPF(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{PublicIface: "em0"})
	ctx := t.Context()
	tr := newTranscript(t, h)
	redirects := []freebsd.Redirect{
		{Port: 443, To: netip.MustParseAddrPort("192.0.2.10:8443")},
		{Port: 80, To: netip.MustParseAddrPort("192.0.2.10:8080")},
	}
	tr.step("load the anchor", func() {
		if err := d.SetRedirects(ctx, redirects); err != nil {
			t.Fatal(err)
		}
	})
	rules, err := os.ReadFile(filepath.Join(h.root, freebsd.PFRulesFile))
	if err != nil {
		t.Fatal(err)
	}
	tr.b.WriteString("# " + freebsd.PFRulesFile + ":\n" + string(rules))
	if got := h.sim.State().PF.Anchors[freebsd.PFAnchor]; len(got) != 2 {
		t.Errorf("anchor %q holds %q, want the two rules", freebsd.PFAnchor, got)
	}
	if c := changing(tr.step("the same again: nothing is loaded", func() {
		if err := d.SetRedirects(ctx, redirects); err != nil {
			t.Fatal(err)
		}
	})); len(c) > 0 {
		t.Errorf("the same redirects again ran %q", c)
	}
	tr.step("no redirects: the anchor is emptied", func() {
		if err := d.SetRedirects(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
	if got := h.sim.State().PF.Anchors[freebsd.PFAnchor]; len(got) != 0 {
		t.Errorf("anchor %q holds %q, want none", freebsd.PFAnchor, got)
	}
	h.leaks(t, fbsdsim.Expect{})
	tr.check("pf")
}

// replace rewrites what the transcript holds so far (digests, which a new
// version of the image-building library could change).
func (tr *transcript) replace(old, new string) {
	s := strings.ReplaceAll(tr.b.String(), old, new)
	tr.b.Reset()
	tr.b.WriteString(s)
}

func TestTranscriptOCIImage(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{Now: func() time.Time { return imageAdded }})
	ctx := t.Context()
	ref, img := pullImage(t)
	tr := newTranscript(t, h)
	tr.step("add an image: its dataset (and the parent, once), unpacked, read-only, then @keel with the metadata", func() {
		if err := d.AddImage(ctx, img, 0); err != nil {
			t.Fatal(err)
		}
	})
	tr.step("add it again: it is whole", func() {
		if err := d.AddImage(ctx, img, 0); err != nil {
			t.Fatal(err)
		}
	})
	tr.step("list the images", func() {
		if list, err := d.Images(ctx); err != nil || len(list) != 1 {
			t.Fatalf("Images = %v, %v", list, err)
		}
	})
	spec := ociSpec("web-0", ref)
	tr.step("start an instance: its root is a clone of the image's @keel", func() {
		if _, err := d.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
	})
	tr.step("remove the image while the root is its clone: refused, nothing destroyed", func() {
		if err := d.RemoveImage(ctx, ref.Digest); !errors.Is(err, nodeexec.ErrBusy) {
			t.Fatalf("RemoveImage = %v, want ErrBusy", err)
		}
	})
	tr.step("stop and delete the instance", func() {
		if err := d.Stop(ctx, spec.Name, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := d.Destroy(ctx, spec.Name); err != nil {
			t.Fatal(err)
		}
	})
	tr.step("remove the image", func() {
		if err := d.RemoveImage(ctx, ref.Digest); err != nil {
			t.Fatal(err)
		}
	})
	h.leaks(t, fbsdsim.Expect{})
	for i, l := range img.LayerDigests() {
		tr.replace(l, fmt.Sprintf("sha256:<layer%d>", i))
	}
	tr.replace(img.Manifest, "sha256:<manifest>")
	tr.replace(ref.Hex(), "<image>")
	tr.check("oci-image")
}
