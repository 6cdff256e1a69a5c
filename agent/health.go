package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/probe"
	"github.com/keel-dev/keel/report"
)

// newProber returns the prober of the instances' health checks: exec
// checks run through the driver when it can run them.
func newProber(opts Options) *probe.Prober {
	execer, _ := opts.Driver.(nodeexec.Execer)
	return probe.New(probe.Options{Exec: execer, Logger: opts.Logger.With("node", opts.Node), Now: opts.Now})
}

// identity names an instance's process for the prober: a new process
// starts its checks from scratch.
func identity(st nodeexec.InstanceState) string {
	return fmt.Sprintf("%d/%d", st.PID, st.StartTime)
}

// syncChecks hands the prober the instances that run now, with their
// checks, and asks the reconciler to restart those whose liveness (or
// startup) check failed. It returns how many run without being ready yet
// and without a failure, started less than opSettle ago: the report
// waits for them a moment, as for operations in flight (publish), so that
// a replica that is ready at once is reported once, ready.
func (a *Agent) syncChecks(now time.Time) (warming int) {
	held := a.rec.Instances()
	targets := make([]probe.Target, 0, len(held))
	for _, name := range slices.Sorted(maps.Keys(held)) {
		st := held[name]
		addr, err := netip.ParseAddr(st.Address)
		if st.State != report.StateRunning || st.PID == 0 || err != nil {
			continue
		}
		targets = append(targets, probe.Target{Name: name, Address: addr, Identity: identity(st), Checks: st.Spec.Checks})
	}
	if err := a.prober.Set(targets); err != nil {
		a.log.Warn("health checks", "err", err)
	}
	for _, t := range targets {
		s, ok := a.prober.Status(t.Name)
		st := held[t.Name]
		switch {
		case !ok:
		case s.LivenessFailed:
			a.rec.Restart(t.Name, st.PID, st.StartTime, "restarted: "+s.Failure)
		case !s.Ready && s.Failure == "" && (now.Sub(st.Started) < opSettle || now.Sub(a.started) < opSettle):
			// Just started, or found running by an agent that just
			// started (its checks have not run yet: a first report
			// saying every instance unready would take them all out of
			// the peers' endpoints).
			warming++
		}
	}
	return warming
}

// checked sets what the health checks say of each running instance of a
// report: whether it is ready, since when, and the last failure. An
// instance seen ready at its spec hash is proven at it (the reconciler's
// state keeps that): its report carries no specSince at that hash from
// then on, so that a later crash or unreadiness is no rollout that failed
// to become ready within progressDeadline.
func (a *Agent) checked(instances []report.Instance) {
	for i := range instances {
		ri := &instances[i]
		if ri.State != report.StateRunning {
			continue
		}
		s, _ := a.prober.Status(ri.Name)
		ri.Ready = &s.Ready
		if s.Ready {
			ri.ReadySince = s.ReadySince.UTC().Truncate(time.Millisecond)
			ri.SpecSince = time.Time{}
			a.rec.Proven(ri.Name, ri.SpecHash)
		}
		ri.Check = strings.ToValidUTF8(s.Failure, "?")
	}
}
