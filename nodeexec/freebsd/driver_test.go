package freebsd_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// simpleSpec is a vnet jail without volumes at address.
func simpleSpec(name, address string) nodeexec.InstanceSpec {
	return nodeexec.InstanceSpec{
		Name:     name,
		Node:     "n1",
		Address:  netip.MustParseAddr(address),
		SpecHash: "hash-" + name,
		Spec: render.JailSpec{
			Image:     "base/test",
			Command:   []string{"/bin/sleep", "300"},
			Network:   render.Network{VNet: true},
			Resources: render.Resources{CPU: 1000, Memory: 512 << 20},
		},
	}
}

func run(t *testing.T, h *host, argv ...string) {
	t.Helper()
	res, err := h.sim.Run(t.Context(), argv)
	if err != nil || res.Code != 0 {
		t.Fatalf("%s: %v %s", strings.Join(argv, " "), err, res.Stderr)
	}
}

// An agent restarted (a new Driver on the same state directory) finds the
// running jail with the identity Start returned, stops it (an adopted
// workload: its exit is unknown), and removes the VIPs and routes the first
// run added, and only those.
func TestAdoptionAfterRestart(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	state := t.TempDir()
	first := h.driver(t, state, freebsd.Options{})
	ctx := t.Context()
	spec := simpleSpec("web-0", "10.0.60.5")
	p, err := first.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SetVIPs(ctx, []netip.Addr{netip.MustParseAddr("10.96.0.10")}); err != nil {
		t.Fatal(err)
	}
	if err := first.SetRoutes(ctx, []nodeexec.Route{{Dest: netip.MustParsePrefix("10.0.7.0/24"), Via: netip.MustParseAddr("192.0.2.7")}}); err != nil {
		t.Fatal(err)
	}
	// What the operator added by hand on the same bridge and table.
	run(t, h, "ifconfig", "keel0", "alias", "10.96.9.9", "netmask", "255.255.255.255")
	run(t, h, "route", "add", "-net", "10.0.99.0/24", "192.0.2.99")

	second := h.driver(t, state, freebsd.Options{})
	running, err := second.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := running["web-0"]; got != p {
		t.Fatalf("the restarted agent sees %+v, Start returned %+v", got, p)
	}
	if _, err := second.Start(ctx, spec); !errors.Is(err, nodeexec.ErrAlreadyRunning) {
		t.Fatalf("Start after the restart: %v, want ErrAlreadyRunning (never a second copy)", err)
	}
	if err := second.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if e, ok := second.Exited("web-0"); !ok || e.Known || e.Code != -1 {
		t.Errorf("Exited of an adopted instance = %+v, %v; want an unknown exit", e, ok)
	}
	if err := second.Destroy(ctx, "web-0"); err != nil {
		t.Fatal(err)
	}
	if err := second.SetVIPs(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := second.SetRoutes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{VIPs: []string{"10.96.9.9"}, Routes: []string{"10.0.99.0/24"}})
}

// After a reboot (kern.boottime changed) the aliases and routes Keel had
// added are gone, and what now holds those addresses is not Keel's: a
// restarted agent forgets its records instead of removing them.
func TestRebootForgetsNetworkRecords(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	state := t.TempDir()
	first := h.driver(t, state, freebsd.Options{})
	ctx := t.Context()
	if err := first.SetRoutes(ctx, []nodeexec.Route{{Dest: netip.MustParsePrefix("10.0.7.0/24"), Via: netip.MustParseAddr("192.0.2.7")}}); err != nil {
		t.Fatal(err)
	}
	if err := first.SetVIPs(ctx, []netip.Addr{netip.MustParseAddr("10.96.0.10")}); err != nil {
		t.Fatal(err)
	}
	// The reboot, then the operator's own route and alias on the same
	// destinations.
	run(t, h, "route", "delete", "-net", "10.0.7.0/24")
	run(t, h, "ifconfig", "keel0", "-alias", "10.96.0.10")
	h.sim.SetSysctl("kern.boottime", "{ sec = 1700086400, usec = 0 } Wed Nov 15 22:13:20 2023")
	run(t, h, "route", "add", "-net", "10.0.7.0/24", "192.0.2.77")
	run(t, h, "ifconfig", "keel0", "alias", "10.96.0.10", "netmask", "255.255.255.255")

	second := h.driver(t, state, freebsd.Options{})
	h.rec.take()
	if err := second.SetRoutes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := second.SetVIPs(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if cmds := h.rec.take(); len(cmds) != 0 {
		t.Errorf("after a reboot the agent removed what is no longer its own: %q", cmds)
	}
}

// With kern.racct.enable=0 an instance with limits is refused with
// ErrRacctDisabled before anything is created (never run unlimited); one
// without limits runs.
func TestRacctDisabledRefusesLimits(t *testing.T) {
	h := newHost(t, fbsdsim.Options{Racct: "0"})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	h.rec.take()
	spec := simpleSpec("web-0", "10.0.60.5")
	if _, err := d.Start(ctx, spec); !errors.Is(err, freebsd.ErrRacctDisabled) {
		t.Fatalf("Start with limits: %v, want ErrRacctDisabled", err)
	}
	if c := changing(h.rec.take()); len(c) > 0 {
		t.Errorf("a refused Start ran %q", c)
	}
	h.leaks(t, fbsdsim.Expect{})
	spec.Spec.Resources = render.Resources{}
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatalf("Start without limits: %v", err)
	}
	if err := d.Apply(ctx, "web-0", render.Resources{CPU: 500}); !errors.Is(err, freebsd.ErrRacctDisabled) {
		t.Errorf("Apply of limits: %v, want ErrRacctDisabled", err)
	}
	problems, err := d.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(problems, func(p freebsd.Problem) bool {
		return p.Check == "racct" && strings.Contains(p.Fix, "kern.racct.enable=1")
	}) {
		t.Errorf("Check = %v, want the racct problem with its fix", problems)
	}
}

// A refreshed base (a newer keel-* snapshot) is what new jails are cloned
// from; an existing jail keeps the root it was cloned with.
func TestRefreshedBase(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	if _, err := d.Start(ctx, simpleSpec("old", "10.0.60.5")); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(h.root, "zroot/keel/base/test")
	if err := os.WriteFile(filepath.Join(base, "etc", "version"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, h, "zfs", "snapshot", "zroot/keel/base/test@keel-2")
	run(t, h, "zfs", "snapshot", "zroot/keel/base/test@unrelated") // not a keel snapshot: ignored
	if _, err := d.Start(ctx, simpleSpec("new", "10.0.60.6")); err != nil {
		t.Fatal(err)
	}
	st := h.sim.State()
	if o := st.Datasets["zroot/keel/jails/old"].Origin; o != "zroot/keel/base/test@keel" {
		t.Errorf("old jail's origin = %q", o)
	}
	if o := st.Datasets["zroot/keel/jails/new"].Origin; o != "zroot/keel/base/test@keel-2" {
		t.Errorf("new jail's origin = %q, want the refreshed snapshot", o)
	}
	if _, err := os.Stat(filepath.Join(h.root, "zroot/keel/jails/new/etc/version")); err != nil {
		t.Errorf("the new jail lacks the refreshed file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.root, "zroot/keel/jails/old/etc/version")); err == nil {
		t.Errorf("the refresh changed an existing jail's root")
	}
}

// racer is a Runner on which another provision takes the base's snapshot
// between this one's listing and its own zfs snapshot.
type racer struct {
	*recorder
	once gosync.Once
}

func (r *racer) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	if len(argv) == 3 && argv[0] == "zfs" && argv[1] == "snapshot" {
		r.once.Do(func() { _, _ = r.sim.Run(ctx, argv) })
	}
	return r.recorder.Run(ctx, argv)
}

// The snapshot race (docs/freebsd-notes.md §2.2): a zfs snapshot that
// fails because another provision took it is not a failure.
func TestSnapshotRace(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d, err := freebsd.New(t.Context(), freebsd.Options{Runner: &racer{recorder: h.rec}, Root: h.root, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(t.Context(), simpleSpec("web-0", "10.0.60.5")); err != nil {
		t.Fatalf("Start after losing the snapshot race: %v", err)
	}
}

// A jail's root is the jail's: a symbolic link inside it (made by the base
// or by root in the jail) is followed as the jail sees it, so a volume is
// never mounted, nor a directory made, outside the jail's root.
func TestVolumeMountStaysInsideTheJail(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	base := filepath.Join(h.root, "zroot/keel/base/test")
	if err := os.Symlink("/etc", filepath.Join(base, "data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../../../tmp/escape", filepath.Join(base, "up")); err != nil {
		t.Fatal(err)
	}
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	spec := simpleSpec("web-0", "10.0.60.5")
	spec.Spec.Volumes = []render.Volume{{Name: "v1", MountPath: "/data/app"}, {Name: "v2", MountPath: "/up/x"}}
	spec.Volumes = map[string]string{}
	for _, v := range spec.Spec.Volumes {
		p, err := d.EnsureVolume(ctx, v.Name, 0)
		if err != nil {
			t.Fatal(err)
		}
		spec.Volumes[v.Name] = p
	}
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, m := range h.sim.State().Mounts {
		if m.FSType == "nullfs" {
			points = append(points, m.On)
		}
	}
	slices.Sort(points)
	want := []string{"/zroot/keel/jails/web-0/etc/app", "/zroot/keel/jails/web-0/tmp/escape/x"}
	if !slices.Equal(points, want) {
		t.Errorf("nullfs mounts on %q, want %q", points, want)
	}
	for _, p := range []string{"/etc/app", "/tmp/escape"} {
		if _, err := os.Lstat(filepath.Join(h.root, p)); err == nil {
			t.Errorf("%s was made outside the jail", p)
		}
	}
}

// A volume mounted in a jail (running or stopped) cannot be deleted, and
// says by which; once its jail is destroyed it can.
func TestDeleteVolumeStillMounted(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	spec := simpleSpec("db-0", "10.0.60.5")
	path, err := d.EnsureVolume(ctx, "db-0-data", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.sim.Run(ctx, []string{"zfs", "get", "-H", "-o", "value", "quota", "zroot/keel/volumes/db-0-data"})
	if q := strings.TrimSpace(string(res.Stdout)); err != nil || q != "64M" {
		t.Errorf("quota = %q, %v; want 64M (docs/freebsd-notes.md §2.3)", q, err)
	}
	spec.Spec.Volumes = []render.Volume{{Name: "db-0-data", MountPath: "/var/db"}}
	spec.Volumes = map[string]string{"db-0-data": path}
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, "db-0", time.Second); err != nil {
		t.Fatal(err)
	}
	err = d.DeleteVolume(ctx, "db-0-data")
	if !errors.Is(err, nodeexec.ErrBusy) || !strings.Contains(err.Error(), "still mounted by db-0") {
		t.Fatalf("DeleteVolume of a mounted volume: %v, want ErrBusy, still mounted by db-0", err)
	}
	if err := d.Destroy(ctx, "db-0"); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteVolume(ctx, "db-0-data"); err != nil {
		t.Fatalf("DeleteVolume once unmounted: %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})
}

// An epair ordinal is never one in use: not another tool's epair, not one
// an earlier run of the agent used.
func TestEpairOrdinals(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	run(t, h, "ifconfig", "epair1", "create") // another tool's
	state := t.TempDir()
	first := h.driver(t, state, freebsd.Options{})
	ctx := t.Context()
	if _, err := first.Start(ctx, simpleSpec("a", "10.0.60.5")); err != nil {
		t.Fatal(err)
	}
	second := h.driver(t, state, freebsd.Options{}) // a restarted agent
	if _, err := second.Start(ctx, simpleSpec("b", "10.0.60.6")); err != nil {
		t.Fatal(err)
	}
	st := h.sim.State()
	for epair, jail := range map[string]string{"epair2b": "keel-a", "epair3b": "keel-b"} {
		if i := st.Iface(jail, epair); i == nil {
			t.Errorf("%s is not in %s", epair, jail)
		}
	}
	if i := st.Iface("", "epair1a"); i == nil {
		t.Errorf("the other tool's epair1a is gone")
	}
}

// Check lists each host prerequisite that does not hold, with its fix,
// and nothing on a host that is ready.
func TestCheck(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	if problems, err := d.Check(t.Context()); err != nil || len(problems) != 0 {
		t.Errorf("Check of a ready host = %v, %v", problems, err)
	}
	bare := newHost(t, fbsdsim.Options{Forwarding: "0", Racct: "0", NoPF: true})
	run(t, bare, "zfs", "destroy", "zroot/keel/volumes")
	bare.sim.SetSysctl("kern.features.vimage", "0")
	d = bare.driver(t, "", freebsd.Options{PublicIface: "em0"})
	problems, err := d.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var checks []string
	for _, p := range problems {
		checks = append(checks, p.Check)
		if p.Problem == "" || p.Fix == "" {
			t.Errorf("problem without its text or fix: %+v", p)
		}
	}
	if want := []string{"datasets", "forwarding", "racct", "vnet", "pf"}; !slices.Equal(checks, want) {
		t.Errorf("Check found %q, want %q: %v", checks, want, problems)
	}
	// Each is a check the report format knows, so that every problem
	// reaches the node's report.
	var rps []report.Problem
	for _, p := range problems {
		rps = append(rps, report.Problem(p))
	}
	if kept, dropped := report.TrimProblems(rps); dropped != 0 || len(kept) != len(problems) {
		t.Errorf("the node's report would leave out %d of %v", dropped, problems)
	}
}

// A jail whose command starts daemons and returns (as /etc/rc does) runs
// as long as its jail holds a live process; its end is then not the first
// process's, so its exit is unknown.
func TestDetachedWorkload(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	p, err := d.Start(ctx, simpleSpec("web-0", "10.0.60.5"))
	if err != nil {
		t.Fatal(err)
	}
	// A daemon the command started, then the command's own exit.
	daemon, err := h.sim.Start([]string{"jexec", "keel-web-0", "/bin/sleep", "600"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = daemon.Wait() }()
	if res, err := h.sim.Run(ctx, []string{"kill", "-s", "KILL", itoa(p.PID)}); err != nil || res.Code != 0 {
		t.Fatal(err, string(res.Stderr))
	}
	// Until the driver has reaped its first process, which ps then no
	// longer shows.
	eventually(t, func() bool { return !slices.Contains(psPIDs(h), p.PID) })
	r, err := d.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := r["web-0"]; !ok || got != p {
		t.Fatalf("Running = %+v, want web-0 running as %+v while its daemon lives", r, p)
	}
	if _, ok := d.Exited("web-0"); ok {
		t.Fatalf("an exit is recorded while the jail runs")
	}
	h.sim.Crash("keel-web-0", 0)
	eventually(t, func() bool {
		r, _ := d.Running(ctx)
		_, ok := r["web-0"]
		return !ok
	})
	if e, ok := d.Exited("web-0"); !ok || e.Known {
		t.Errorf("Exited = %+v, %v; want an unknown exit (the jail outlived its first process)", e, ok)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// psPIDs lists the processes the simulated host has in jails.
func psPIDs(h *host) []int {
	var pids []int
	for _, p := range h.sim.State().Procs {
		pids = append(pids, p.Pid)
	}
	return pids
}

// eventually polls cond with a growing interval until it holds, failing
// the test after a while.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for interval := time.Millisecond; !cond(); interval = min(2*interval, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a condition")
		}
		select {
		case <-time.After(interval):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

// An instance's logs are files under the state directory, capped by
// Running at Options.LogMax (the newest half kept), and Logs shows their
// tail.
func TestLogsCapped(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	state := t.TempDir()
	d := h.driver(t, state, freebsd.Options{LogMax: 100})
	ctx := t.Context()
	if _, err := d.Start(ctx, simpleSpec("web-0", "10.0.60.5")); err != nil {
		t.Fatal(err)
	}
	// The simulated workload writes nothing: write as it would.
	log := filepath.Join(state, "freebsd", "instances", "web-0", "stdout.log")
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("the workload's stdout is not %s: %v", log, err)
	}
	for i := range 50 {
		fmt.Fprintf(f, "line %02d\n", i)
	}
	f.Close()
	if _, err := d.Running(ctx); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(log); err != nil || fi.Size() > 100 {
		t.Fatalf("after Running the log is %v bytes (%v), want at most 100", fi.Size(), err)
	}
	b, err := d.Logs("web-0", 1000)
	if err != nil || !strings.HasSuffix(string(b), "line 49\n") || !strings.HasPrefix(string(b), "==> stdout <==\n") {
		t.Errorf("Logs = %q, %v", b, err)
	}
}

// After a reboot the jail is gone and its root, the jail's own, stays: a
// /dev the jail made a link is refused, never followed out of the root.
func TestJailDevLinkRefused(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	spec := simpleSpec("web-0", "10.0.60.5")
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	// The reboot: no jail, no mount, no epair.
	run(t, h, "ifconfig", "epair1a", "destroy")
	run(t, h, "jail", "-r", "keel-web-0")
	run(t, h, "umount", "/zroot/keel/jails/web-0/dev")
	dev := filepath.Join(h.root, "zroot/keel/jails/web-0/dev")
	if err := os.RemoveAll(dev); err != nil {
		t.Fatal(err)
	}
	// A directory of the host, outside the jail's root.
	if err := os.Mkdir(filepath.Join(h.root, "outside"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../outside", dev); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(ctx, spec); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("Start on a root whose /dev is a link: %v, want a refusal", err)
	}
}
