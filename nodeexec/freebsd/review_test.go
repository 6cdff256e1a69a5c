package freebsd_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
)

// killer is a Runner that makes its n-th command (counting from 1) fail
// as a command killed with the agent would: before it ran (after=false),
// or after it ran to its end (after=true).
type killer struct {
	inner freebsd.Runner
	mu    gosync.Mutex
	n     int
	at    int
	after bool
	// dead: the agent died at the n-th command: every later one fails too.
	dead bool
	hit  string
}

var errKilled = errors.New("injected: killed")

// tick counts a command and says whether it fails, and whether it runs
// first.
func (k *killer) tick(argv []string) (fail, runs bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n++
	if k.n == k.at {
		k.hit = strings.Join(argv, " ")
		return true, k.after
	}
	// A dead agent runs nothing more.
	return k.dead && k.at > 0 && k.n > k.at, false
}

func (k *killer) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	fail, runs := k.tick(argv)
	if !fail {
		return k.inner.Run(ctx, argv)
	}
	if runs {
		_, _ = k.inner.Run(ctx, argv)
	}
	return freebsd.Result{}, errKilled
}

func (k *killer) Start(argv []string, stdout, stderr *os.File) (freebsd.Proc, error) {
	if fail, _ := k.tick(argv); !fail {
		return k.inner.Start(argv, stdout, stderr)
	}
	return nil, errKilled
}

// epairs counts the epair pairs on the host and in jails.
func epairs(st *fbsdsim.State) int {
	n := 0
	for _, i := range st.Ifaces {
		if i.Kind == "epair" && strings.HasSuffix(i.Name, "a") {
			n++
		}
	}
	return n
}

// A provision killed at each of its commands in turn, before or after the
// command ran, then retried by the same driver or by a restarted one,
// ends with one jail, one epair and nothing leaked; a Destroy then leaves
// nothing.
func TestProvisionKilledAtEachStep(t *testing.T) {
	// The number of commands of a whole provision.
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	spec := webSpec(t, d)
	ensureVolumes(t, d, &spec)
	h.rec.take()
	if _, err := d.Start(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	total := len(h.rec.take())
	for _, after := range []bool{false, true} {
		for _, restart := range []bool{false, true} {
			for at := 1; at <= total; at++ {
				t.Run(fmt.Sprintf("after=%v/restart=%v/%d", after, restart, at), func(t *testing.T) {
					provisionKilledAt(t, at, after, restart)
				})
			}
		}
	}
}

func provisionKilledAt(t *testing.T, at int, after, restart bool) {
	dead := restart
	ctx := t.Context()
	h := newHost(t, fbsdsim.Options{})
	state := t.TempDir()
	k := &killer{inner: h.rec}
	d, err := freebsd.New(ctx, freebsd.Options{Runner: k, Root: h.root, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	spec := webSpec(t, d)
	ensureVolumes(t, d, &spec)
	k.mu.Lock()
	k.at, k.n, k.after, k.dead = at, 0, after, dead
	k.mu.Unlock()
	_, err = d.Start(ctx, spec)
	t.Logf("killed at %q: Start = %v", k.hit, err)
	if restart {
		d = h.driver(t, state, freebsd.Options{})
	}
	h.rec.take()
	if err != nil {
		if _, err := d.Start(ctx, spec); err != nil && !errors.Is(err, nodeexec.ErrAlreadyRunning) {
			t.Fatalf("the retry: %v", err)
		}
	}
	for _, c := range h.rec.take() {
		t.Logf("retry ran %q", c)
	}
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
	if n := epairs(h.sim.State()); n != 1 {
		t.Errorf("%d epairs, want 1", n)
	}
	if r, err := d.Running(ctx); err != nil || len(r) != 1 {
		t.Errorf("Running = %v, %v", r, err)
	}
	if err := d.Stop(ctx, spec.Name, time.Second); err != nil {
		t.Fatal(err)
	}
	h.rec.take()
	if err := d.Destroy(ctx, spec.Name); err != nil {
		for _, c := range h.rec.take() {
			t.Logf("ran %q", c)
		}
		st := h.sim.State()
		t.Logf("mounts %+v", st.Mounts)
		for n, j := range st.Jails {
			t.Logf("jail %s %+v", n, j)
		}
		t.Logf("procs %+v", st.Procs)
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{})
	if n := epairs(h.sim.State()); n != 0 {
		t.Errorf("%d epairs after Destroy, want 0", n)
	}
}

// A Destroy killed at each of its commands, then run again (by the same
// driver or a restarted one), leaves nothing.
func TestDestroyKilledAtEachStep(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	spec := webSpec(t, d)
	ensureVolumes(t, d, &spec)
	if _, err := d.Start(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(t.Context(), spec.Name, time.Second); err != nil {
		t.Fatal(err)
	}
	h.rec.take()
	if err := d.Destroy(t.Context(), spec.Name); err != nil {
		t.Fatal(err)
	}
	total := len(h.rec.take())
	for _, after := range []bool{false, true} {
		for _, restart := range []bool{false, true} {
			for at := 1; at <= total; at++ {
				t.Run(fmt.Sprintf("after=%v/restart=%v/%d", after, restart, at), func(t *testing.T) {
					destroyKilledAt(t, at, after, restart)
				})
			}
		}
	}
}

func destroyKilledAt(t *testing.T, at int, after, restart bool) {
	dead := restart
	ctx := t.Context()
	h := newHost(t, fbsdsim.Options{})
	state := t.TempDir()
	k := &killer{inner: h.rec}
	d, err := freebsd.New(ctx, freebsd.Options{Runner: k, Root: h.root, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	spec := webSpec(t, d)
	ensureVolumes(t, d, &spec)
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, spec.Name, time.Second); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.at, k.n, k.after, k.dead = at, 0, after, dead
	k.mu.Unlock()
	err = d.Destroy(ctx, spec.Name)
	t.Logf("killed at %q: Destroy = %v", k.hit, err)
	if restart {
		d = h.driver(t, state, freebsd.Options{})
	}
	if err := d.Destroy(ctx, spec.Name); err != nil {
		t.Fatalf("the second Destroy: %v", err)
	}
	h.leaks(t, fbsdsim.Expect{})
	if n := epairs(h.sim.State()); n != 0 {
		t.Errorf("%d epairs after Destroy, want 0", n)
	}
	// A new instance of the same name provisions cleanly.
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{Jails: []string{"keel-web-0"}})
}

// An undo interrupted after jail -r left the root's devfs mounted; the
// retry's jail -c mounts a second devfs on top (jail(8) does not look:
// usr.sbin/jail/command.c IP_MOUNT_DEVFS). Destroy must unmount both, or
// the root stays busy.
func TestStackedDevfsUnmounted(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	d := h.driver(t, "", freebsd.Options{})
	ctx := t.Context()
	spec := simpleSpec("a", "10.0.60.5")
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	run(t, h, "jail", "-r", "keel-a") // devfs stays (docs/freebsd-notes.md §10.23)
	if _, err := d.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{})
}

// gate is a Runner that holds the first command starting with prefix
// until released: a slow command.
type gate struct {
	inner   freebsd.Runner
	prefix  string
	once    gosync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *gate) hold(argv []string) {
	if strings.HasPrefix(strings.Join(argv, " "), g.prefix) {
		held := false
		g.once.Do(func() { held = true })
		if held {
			close(g.reached)
			<-g.release
		}
	}
}

func (g *gate) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	g.hold(argv)
	return g.inner.Run(ctx, argv)
}

func (g *gate) Start(argv []string, stdout, stderr *os.File) (freebsd.Proc, error) {
	g.hold(argv)
	return g.inner.Start(argv, stdout, stderr)
}

// While one instance's provision is held at any of its commands, what the
// node's report and loop call (Running, Capacity, Exited, Volumes,
// SetRoutes, SetVIPs, Check) and another instance's Start do not wait for
// it.
func TestSlowProvisionBlocksNothingElse(t *testing.T) {
	for _, prefix := range []string{
		"zfs clone", "jail -c", "mount -t nullfs", "ifconfig epair1a", "ifconfig bridge create",
		"ifconfig keel0 inet", "ifconfig epair1 create", "jexec keel-web-0 /sbin/route", "rctl -a", "jexec keel-web-0 /usr/bin/env",
	} {
		t.Run(prefix, func(t *testing.T) {
			h := newHost(t, fbsdsim.Options{})
			g := &gate{inner: h.rec, prefix: prefix, reached: make(chan struct{}), release: make(chan struct{})}
			d, err := freebsd.New(t.Context(), freebsd.Options{Runner: g, Root: h.root, StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			spec := webSpec(t, d)
			ensureVolumes(t, d, &spec)
			done := make(chan error, 1)
			go func() { _, err := d.Start(context.Background(), spec); done <- err }()
			<-g.reached
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			// The node-wide network calls wait for the one network command
			// held under the network lock; nothing else does.
			network := strings.HasPrefix(prefix, "ifconfig keel0") || strings.HasPrefix(prefix, "ifconfig bridge") || prefix == "ifconfig epair1a"
			calls := map[string]func() error{
				"Running":  func() error { _, err := d.Running(ctx); return err },
				"Capacity": func() error { _, err := d.Capacity(ctx); return err },
				"Volumes":  func() error { _, err := d.Volumes(ctx); return err },
				"Check":    func() error { _, err := d.Check(ctx); return err },
			}
			if !network {
				calls["SetRoutes"] = func() error {
					return d.SetRoutes(ctx, []nodeexec.Route{{Dest: netip.MustParsePrefix("10.0.61.0/24"), Via: netip.MustParseAddr("10.0.60.7")}})
				}
				calls["SetVIPs"] = func() error { return d.SetVIPs(ctx, []netip.Addr{netip.MustParseAddr("10.0.200.1")}) }
				calls["Start b"] = func() error { _, err := d.Start(ctx, simpleSpec("b", "10.0.60.9")); return err }
			}
			var wg gosync.WaitGroup
			for name, call := range calls {
				wg.Go(func() {
					err := call()
					switch {
					case ctx.Err() != nil:
						t.Errorf("%s waits behind a provision held at %q", name, prefix)
					case err != nil && name != "SetRoutes":
						t.Errorf("%s: %v", name, err)
					}
				})
			}
			wg.Wait()
			close(g.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// dier is a Runner whose goroutine dies (runtime.Goexit, deferred unlocks
// run) right after the first command starting with prefix ran: the agent
// killed between a command and the record of its outcome.
type dier struct {
	inner  freebsd.Runner
	prefix string
	once   gosync.Once
}

func (k *dier) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	res, err := k.inner.Run(ctx, argv)
	if strings.HasPrefix(strings.Join(argv, " "), k.prefix) {
		die := false
		k.once.Do(func() { die = true })
		if die {
			runtime.Goexit()
		}
	}
	return res, err
}

func (k *dier) Start(argv []string, stdout, stderr *os.File) (freebsd.Proc, error) {
	return k.inner.Start(argv, stdout, stderr)
}

// An alias and a route the operator added by hand, equal to what Keel
// wants, stay when Keel no longer wants them, even when the agent died
// right after its own add failed on them and a restarted agent retries.
func TestOperatorsAliasAndRouteSurviveACrash(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	run(t, h, "ifconfig", "bridge", "create")
	run(t, h, "ifconfig", "bridge0", "name", "keel0")
	run(t, h, "ifconfig", "keel0", "inet", "10.0.60.1/24")
	run(t, h, "ifconfig", "keel0", "alias", "10.0.200.1", "netmask", "255.255.255.255")
	run(t, h, "route", "add", "-net", "10.0.61.0/24", "10.0.60.7")
	state := t.TempDir()
	vip := []netip.Addr{netip.MustParseAddr("10.0.200.1")}
	route := []nodeexec.Route{{Dest: netip.MustParsePrefix("10.0.61.0/24"), Via: netip.MustParseAddr("10.0.60.7")}}
	for _, prefix := range []string{"ifconfig keel0 alias 10.0.200.1", "route add -net 10.0.61.0/24"} {
		d, err := freebsd.New(t.Context(), freebsd.Options{Runner: &dier{inner: h.rec, prefix: prefix}, Root: h.root, StateDir: state})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if strings.HasPrefix(prefix, "route") {
				_ = d.SetRoutes(t.Context(), route)
			} else {
				_ = d.SetVIPs(t.Context(), vip)
			}
		}()
		<-done
	}
	d := h.driver(t, state, freebsd.Options{}) // restarted
	ctx := t.Context()
	if err := d.SetVIPs(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if err := d.SetRoutes(ctx, route); err != nil {
		t.Fatal(err)
	}
	if err := d.SetVIPs(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.SetRoutes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	h.leaks(t, fbsdsim.Expect{VIPs: []string{"10.0.200.1"}, Routes: []string{"10.0.61.0/24"}})
	st := h.sim.State()
	if !slices.ContainsFunc(st.Routes, func(r fbsdsim.Route) bool { return r.Dest == "10.0.61.0/24" && r.VNet == "" }) {
		t.Errorf("the operator's route 10.0.61.0/24 was removed")
	}
	if i := st.Iface("", "keel0"); i == nil || !slices.ContainsFunc(i.Addrs, func(a fbsdsim.Addr) bool { return a.IP == "10.0.200.1" }) {
		t.Errorf("the operator's alias 10.0.200.1 was removed")
	}
}

// thief is a Runner on which another tool's `ifconfig epair create` takes
// the unit the driver probed free, just before the driver creates it.
type thief struct {
	*recorder
	once gosync.Once
}

func (r *thief) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	if strings.Join(argv, " ") == "ifconfig epair1 create" {
		r.once.Do(func() {
			// The lowest free units: epair0, then epair1.
			for range 2 {
				_, _ = r.sim.Run(ctx, []string{"ifconfig", "epair", "create"})
			}
		})
	}
	return r.recorder.Run(ctx, argv)
}

// Another tool creates an epair between the driver's probe of a free unit
// and its own create: the driver must not take that epair for its own (move
// its b-end into the jail, destroy it on delete), but use another unit.
func TestEpairTakenBetweenProbeAndCreate(t *testing.T) {
	h := newHost(t, fbsdsim.Options{})
	ctx := t.Context()
	d, err := freebsd.New(ctx, freebsd.Options{Runner: &thief{recorder: h.rec}, Root: h.root, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	spec := simpleSpec("a", "10.0.60.5")
	if _, err := d.Start(ctx, spec); err != nil {
		t.Logf("Start: %v", err)
		if _, err := d.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	st := h.sim.State()
	if st.Iface("keel-a", "epair1b") != nil {
		t.Errorf("the other tool's epair1b was moved into keel-a")
		for _, c := range h.rec.take() {
			t.Logf("ran %q", c)
		}
	}
	if err := d.Stop(ctx, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if h.sim.State().Iface("", "epair1a") == nil {
		t.Errorf("the other tool's epair1a was destroyed")
	}
}
