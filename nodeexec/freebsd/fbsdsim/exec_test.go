package fbsdsim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec/freebsd"
)

// TestExecutableMode builds the multi-call binary, installs it as the
// FreeBSD commands and drives it through the real ExecRunner: separate
// processes sharing the state on disk, a jexec workload that is a real
// process, ps and jail -r acting on its pid, concurrent invocations.
func TestExecutableMode(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "fbsdsim")
	build := exec.Command("go", "build", "-o", exe, "github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim/cmd/fbsdsim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bin")
	if err := Install(bin, exe); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	prep := OnDisk(root, Options{})
	if err := prep.MakeBaseImage("zroot/keel/base/test"); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), RootEnv+"="+root, StopTimeoutEnv+"=2s")
	r := freebsd.ExecRunner{BinDir: bin, Env: env}

	must(t, r, "zfs", "create", "zroot/keel/jails")
	must(t, r, "zfs", "snapshot", "zroot/keel/base/test@keel")
	must(t, r, "zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/web")
	must(t, r, "jail", "-c", "name=keel-web", "path=/zroot/keel/jails/web", "vnet", "mount.devfs", "devfs_ruleset=4", "persist")
	jid := strings.TrimSpace(must(t, r, "jls", "-j", "keel-web", "jid"))

	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	p, err := r.Start([]string{"jexec", "keel-web", "sleep", "300"}, null, null)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan int, 1)
	go func() {
		code, _ := p.Wait()
		waited <- code
	}()
	// The jexec process records itself, then execs sleep: poll ps.
	var pids string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if pids = strings.TrimSpace(string(run(t, r, "ps", "-J", jid, "-o", "pid=").Stdout)); pids != "" {
			break
		}
	}
	if pids != strconv.Itoa(p.Pid()) {
		t.Fatalf("ps -J %s -o pid= = %q, want %d", jid, pids, p.Pid())
	}
	// jexec records itself before it execs sleep: poll until the exec.
	var cmdline []byte
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cmdline, err = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid())); err != nil || strings.HasPrefix(string(cmdline), "sleep\x00300") {
			break
		}
	}
	if err != nil || !strings.HasPrefix(string(cmdline), "sleep\x00300") {
		t.Fatalf("workload is not the real sleep: %q %v", cmdline, err)
	}

	// Concurrent invocations: no update may be lost under the lock.
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.Run(context.Background(), []string{"ifconfig", fmt.Sprintf("epair%d", i+10), "create"})
			if err != nil || res.Code != 0 {
				errs <- fmt.Sprintf("epair%d: %v %s", i+10, err, res.Stderr)
			}
			if res, err := r.Run(context.Background(), []string{"sysctl", "-n", "hw.ncpu"}); err != nil || string(res.Stdout) != "4\n" {
				errs <- fmt.Sprintf("sysctl: %v %q", err, res.Stdout)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	st, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if st.Iface("", fmt.Sprintf("epair%da", i+10)) == nil {
			t.Errorf("epair%da lost", i+10)
		}
	}

	must(t, r, "jail", "-r", "keel-web")
	select {
	case code := <-waited:
		if code != -1 {
			t.Fatalf("workload ended with %d, want -1 (killed)", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("jail -r did not kill the workload")
	}
	must(t, r, "umount", "/zroot/keel/jails/web/dev")
	must(t, r, "zfs", "destroy", "zroot/keel/jails/web")
	for i := range 6 {
		must(t, r, "ifconfig", fmt.Sprintf("epair%da", i+10), "destroy")
	}
	st, err = Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if leaks := st.Leaks(); len(leaks) != 0 {
		t.Fatalf("leaks: %q", leaks)
	}
}
