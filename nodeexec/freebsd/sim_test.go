package freebsd_test

import (
	"context"
	"os"
	"slices"
	gosync "sync"
	"testing"

	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
)

// bootTime is the kern.boottime the simulated hosts report (the simulator
// has no such oid of its own): sbin/sysctl/sysctl.c S_timeval's format.
const bootTime = "{ sec = 1700000000, usec = 250000 } Tue Nov 14 22:13:20 2023"

// recorder is a Runner that records every argv it is given, in order, on
// its way to the simulator.
type recorder struct {
	sim *fbsdsim.Sim
	mu  gosync.Mutex
	log [][]string
}

func (r *recorder) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	r.add(argv)
	return r.sim.Run(ctx, argv)
}

func (r *recorder) Start(argv []string, stdout, stderr *os.File) (freebsd.Proc, error) {
	r.add(argv)
	return r.sim.Start(argv, stdout, stderr)
}

func (r *recorder) add(argv []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, slices.Clone(argv))
}

// take returns the commands recorded since the last take.
func (r *recorder) take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// host is a simulated FreeBSD host prepared as the operator would
// (docs/freebsd-notes.md §0): the pool's keel/jails and keel/volumes
// parents and a base image base/test holding what a workload needs.
type host struct {
	root string
	sim  *fbsdsim.Sim
	rec  *recorder
}

func newHost(t *testing.T, opts fbsdsim.Options) *host {
	t.Helper()
	root := t.TempDir()
	sim := fbsdsim.New(root, opts)
	if err := sim.MakeBaseImage("zroot/keel/base/test", "/usr/bin/env"); err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"zroot/keel/jails", "zroot/keel/volumes"} {
		res, err := sim.Run(t.Context(), []string{"zfs", "create", ds})
		if err != nil || res.Code != 0 {
			t.Fatalf("zfs create %s: %v %s", ds, err, res.Stderr)
		}
	}
	sim.SetSysctl("kern.boottime", bootTime)
	sim.SetSysctl("kern.features.vimage", "1")
	return &host{root: root, sim: sim, rec: &recorder{sim: sim}}
}

// driver returns a driver on the host with its own state directory (or
// the given one, for a restarted agent).
func (h *host) driver(t *testing.T, stateDir string, opts freebsd.Options) *freebsd.Driver {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	opts.Runner, opts.Root, opts.StateDir = h.rec, h.root, stateDir
	d, err := freebsd.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// leaks fails the test when the host holds anything Keel created beyond
// what e expects.
func (h *host) leaks(t *testing.T, e fbsdsim.Expect) {
	t.Helper()
	for _, l := range h.sim.State().LeaksExpect(e) {
		t.Errorf("leak: %s", l)
	}
}
