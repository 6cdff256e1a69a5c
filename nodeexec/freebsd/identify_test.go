package freebsd

import (
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
)

// TestIdentifyExitedLeader: a child whose first process ended after ps
// listed it (the reaper got it between ps and identify, as when Stop runs
// beside a scan) did not leave its jail running; only another live
// process in the jail means the command started daemons and returned.
func TestIdentifyExitedLeader(t *testing.T) {
	started := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name     string
		live     []psEntry
		detached bool
	}{
		{"only the leader, just reaped", []psEntry{{PID: 100, State: "S", Start: started}}, false},
		{"a daemon it started", []psEntry{{PID: 100, State: "S", Start: started}, {PID: 101, State: "S", Start: started}}, true},
		{"the daemon alone", []psEntry{{PID: 101, State: "S", Start: started}}, true},
	} {
		c := &child{proc: nodeexec.Process{PID: 100, Started: started}, done: make(chan struct{})}
		close(c.done)
		d := &Driver{children: map[string]*child{"web-0": c}}
		p, kid := d.identify("web-0", tc.live)
		if !kid || p != c.proc {
			t.Errorf("%s: identify = %+v, %v; want the child's process", tc.name, p, kid)
		}
		if c.detached != tc.detached {
			t.Errorf("%s: detached = %v, want %v", tc.name, c.detached, tc.detached)
		}
	}
}
