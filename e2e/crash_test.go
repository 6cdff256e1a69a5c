//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/report"
)

// TestCrashPoints kills an agent at each named step of its work (with
// KEEL_CRASH_AT), restarts it, and checks that nothing was duplicated or
// lost: one process per instance, the same processes for the instances
// that ran before the restart, and a volume's data still there.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	for _, point := range []string{nodeexec.CrashAfterVolume, nodeexec.CrashAfterStart, nodeexec.CrashBeforeStateWrite, nodeexec.CrashBeforeReportPush} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			testCrashPoint(t, point)
		})
	}
}

func testCrashPoint(t *testing.T, point string) {
	const victim = "n2"
	// The victim is away (stopped, crashed, restarted) for a while: a TTL
	// it cannot outlast on a busy machine, so that no one takes its
	// instances meanwhile (a move is not what this test checks).
	c := newCluster(t, 3*time.Minute, localcluster.Options{Nodes: []string{"n1", "n2"},
		LivenessTTL: max(time.Minute, 3*reportInterval), ReportInterval: reportInterval,
		Files: map[string]string{
			"apps/web.yaml":    webService(3, "base/demo", "hello"),
			"jails/store.yaml": jail("store", victim, 9200, true),
		}})
	c.converge("first commit")

	// Data in the volume of the stateful jail, which must survive.
	store := c.procsByInstance()["store"]
	if len(store) != 1 {
		t.Fatalf("store has processes %v", store)
	}
	env, _ := procEnv(store[0].PID)
	volume := env[volumeVar("store-data")]
	if want := filepath.Join(realPath(c.StateDir(victim)), "volumes", "store-data"); volume != want {
		t.Fatalf("store's volume is %q, want %q", volume, want)
	}
	marker := filepath.Join(volume, "marker")
	content := "written before the crash at " + point + "\n"
	if err := os.WriteFile(marker, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}

	// The victim stops cleanly while a change gives it work: a new
	// stateful jail, so a volume to create and a process to start.
	if err := c.Stop(victim, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	before := c.procsByInstance()
	c.commit("add a jail on "+victim, map[string]string{"jails/extra.yaml": jail("extra", victim, 9400, true)})
	if point == nodeexec.CrashBeforeStateWrite || point == nodeexec.CrashBeforeReportPush {
		// These points come in every pass: without a last good commit to
		// carry on with, the first is the one that applies the new commit
		// and starts the new jail, with everything else to adopt.
		if err := os.Remove(filepath.Join(c.StateDir(victim), "last-good")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(victim, nodeexec.CrashEnv+"="+point); err != nil {
		t.Fatal(err)
	}
	if err := c.Exited(c.ctx, victim); err != nil {
		t.Fatalf("the agent did not crash at %s: %v", point, err)
	}
	atCrash := c.procsByInstance()
	t.Logf("crashed at %s with instances %v", point, atCrash)

	// The crash came where it was asked for. The new jail's operation
	// (its volume, then its start) runs off the agent's loop, and the
	// pass that handed it out published the jail as starting: the
	// publisher may have pushed that report before the crash, never one
	// that says more. The state records the jail once a pass has folded
	// the operation's outcome in: after-volume-create and
	// after-process-start come inside the operation, before-state-write
	// in that pass. before-report-push comes at the first push, while the
	// operation may still run: nothing of this run is published then, and
	// the state records the jail only if it runs.
	_, volErr := os.Stat(filepath.Join(c.StateDir(victim), "volumes", "extra-data"))
	saved := savedInstances(t, c.StateDir(victim))
	pub := c.mustPublished()
	victimReport := pub[victim]
	var published report.State
	if ri := victimReport.Instance("extra"); ri != nil {
		published = ri.State
	}
	runs := len(atCrash["extra"]) == 1
	switch point {
	case nodeexec.CrashBeforeReportPush:
		if volErr != nil && runs || saved["extra"] && !runs || published != "" {
			t.Errorf("at the crash: volume %v, extra runs %v, saved in the state %v (want only if it runs), published %q (want nothing)",
				volErr, atCrash["extra"], saved["extra"], published)
		}
	default:
		wantRunning := point != nodeexec.CrashAfterVolume
		if volErr != nil || runs != wantRunning || saved["extra"] || published != "" && published != report.StateStarting {
			t.Errorf("at the crash: volume %v, extra runs %v (want %v), saved in the state %v (want false), published %q (want nothing or starting)",
				volErr, atCrash["extra"], wantRunning, saved["extra"], published)
		}
	}

	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	c.converge("restart after the crash")
	after := c.checkOneEach(c.model())

	// Every instance that ran once before the restart still runs as the
	// same process.
	for name, ps := range atCrash {
		if len(ps) != 1 {
			t.Errorf("%s had %d processes after the crash: %v", name, len(ps), ps)
			continue
		}
		if after[name] != ps[0] {
			t.Errorf("%s ran as %+v before the restart, and as %+v after", name, ps[0], after[name])
		}
	}
	for name, ps := range before {
		if len(atCrash[name]) == 0 {
			t.Errorf("%s (%v) stopped while its agent was away", name, ps)
		}
	}
	got, err := os.ReadFile(marker)
	if err != nil || string(got) != content {
		t.Errorf("the marker in store's volume: %q, %v; want %q", got, err, content)
	}
	if env, _ := procEnv(after["store"].PID); env[volumeVar("store-data")] != volume {
		t.Errorf("store runs with volume %q, want %q", env[volumeVar("store-data")], volume)
	}
	if env, _ := procEnv(after["extra"].PID); env[volumeVar("extra-data")] != filepath.Join(realPath(c.StateDir(victim)), "volumes", "extra-data") {
		t.Errorf("extra runs with volume %q", env[volumeVar("extra-data")])
	}
}

// savedInstances reads which instances the state file of a state directory
// holds.
func savedInstances(t *testing.T, stateDir string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Instances map[string]json.RawMessage `json:"instances"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for name := range st.Instances {
		out[name] = true
	}
	return out
}
