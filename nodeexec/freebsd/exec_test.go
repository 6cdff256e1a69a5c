package freebsd_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec/freebsd"
	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
	"github.com/keel-dev/keel/render"
)

// TestExecutableSimulator runs the driver through ExecRunner on the
// simulator's executables, as `keel agent --driver freebsd` does in the
// end-to-end tests: separate processes sharing the host's state on disk,
// and a workload that is a real process (jexec execs /usr/bin/env, which
// execs sleep) that ps, kill and jail -r act on.
func TestExecutableSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the simulator")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "fbsdsim")
	build := exec.Command("go", "build", "-o", exe, "github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim/cmd/fbsdsim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bin")
	if err := fbsdsim.Install(bin, exe); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	prep := fbsdsim.OnDisk(root, fbsdsim.Options{})
	if err := prep.MakeBaseImage("zroot/keel/base/test", "/usr/bin/env"); err != nil {
		t.Fatal(err)
	}
	for _, ds := range []string{"zroot/keel/jails", "zroot/keel/volumes"} {
		if res, err := prep.Run(t.Context(), []string{"zfs", "create", ds}); err != nil || res.Code != 0 {
			t.Fatalf("zfs create %s: %v %s", ds, err, res.Stderr)
		}
	}
	prep.SetSysctl("kern.boottime", bootTime)
	runner := freebsd.ExecRunner{BinDir: bin, Env: append(os.Environ(), fbsdsim.RootEnv+"="+root, fbsdsim.StopTimeoutEnv+"=2s", "LC_ALL=C")}
	d, err := freebsd.New(t.Context(), freebsd.Options{Runner: runner, Root: root, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	path, err := d.EnsureVolume(ctx, "web-0-data", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	spec := simpleSpec("web-0", "10.0.60.5")
	spec.Spec.Volumes = []render.Volume{{Name: "web-0-data", MountPath: "/var/db"}}
	spec.Volumes = map[string]string{"web-0-data": path}
	p, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("kill", "-KILL", itoa(p.PID)).Run() })
	// ps shows the real process once jexec has recorded itself.
	eventually(t, func() bool {
		st, err := fbsdsim.Load(root)
		return err == nil && len(st.Procs) == 1 && st.Procs[0].Pid == p.PID
	})
	running, err := d.Running(ctx)
	if err != nil || running["web-0"] != p {
		t.Fatalf("Running = %+v, %v; Start returned %+v", running, err, p)
	}
	if _, err := d.Start(ctx, spec); err == nil {
		t.Fatalf("a second Start succeeded")
	}
	if err := d.Stop(ctx, "web-0", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if e, ok := d.Exited("web-0"); !ok || !e.Known || e.Code != -1 {
		t.Errorf("Exited = %+v, %v; want sleep's death by SIGTERM", e, ok)
	}
	if err := d.Destroy(ctx, "web-0"); err != nil {
		t.Fatal(err)
	}
	st, err := fbsdsim.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range st.LeaksExpect(fbsdsim.Expect{}) {
		t.Errorf("leak: %s", l)
	}
}
