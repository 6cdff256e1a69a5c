package freebsd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/drivertest"
	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
)

// simDriver is the freebsd driver on a simulated host, with the
// simulator's hooks for what a workload does by itself.
type simDriver struct {
	*freebsd.Driver
	sim *fbsdsim.Sim
}

func (s simDriver) Crash(name string, code int) error {
	s.sim.Crash("keel-"+name, code)
	return nil
}

func (s simDriver) IgnoreTerm(name string) error {
	s.sim.IgnoreTerm("keel-" + name)
	return nil
}

// TestConformance runs the drivertest suite on the simulator. The suite's
// Environment test is skipped: the driver reports no environment (it is
// in the jexec argv, see the transcripts), and a jail's KEEL_VOLUME_<NAME>
// is the volume's mount path inside the jail, not its host path.
func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) nodeexec.Driver {
		h := newHost(t, fbsdsim.Options{})
		d := h.driver(t, "", freebsd.Options{})
		// After the suite's own cleanups: remove what it left (it stops
		// instances, never destroys them), as the reconciler would, and
		// check that nothing of Keel's is left on the host.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for name := range h.sim.State().Jails {
				inst := strings.TrimPrefix(name, "keel-")
				if err := d.Stop(ctx, inst, 0); err != nil {
					t.Errorf("Stop(%s): %v", inst, err)
				}
				if err := d.Destroy(ctx, inst); err != nil {
					t.Errorf("Destroy(%s): %v", inst, err)
				}
			}
			if err := d.SetVIPs(ctx, nil); err != nil {
				t.Error(err)
			}
			if err := d.SetRoutes(ctx, nil); err != nil {
				t.Error(err)
			}
			h.leaks(t, fbsdsim.Expect{})
		})
		return simDriver{Driver: d, sim: h.sim}
	})
}
