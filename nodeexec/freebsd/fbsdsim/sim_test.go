package fbsdsim

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec/freebsd"
)

var _ freebsd.Runner = (*Sim)(nil)

func run(t *testing.T, r freebsd.Runner, argv ...string) freebsd.Result {
	t.Helper()
	res, err := r.Run(context.Background(), argv)
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return res
}

// must runs argv and fails the test unless it exits 0.
func must(t *testing.T, r freebsd.Runner, argv ...string) string {
	t.Helper()
	res := run(t, r, argv...)
	if res.Code != 0 {
		t.Fatalf("%v: exit %d: %s%s", argv, res.Code, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// host builds a simulated host with the layout an operator prepares
// (docs/freebsd-notes.md §0): a base image with @keel, the jails and
// volumes parents.
func host(t *testing.T) (*Sim, string) {
	t.Helper()
	root := t.TempDir()
	s := New(root, Options{StopTimeout: 200e6})
	if err := s.MakeBaseImage("zroot/keel/base/test"); err != nil {
		t.Fatal(err)
	}
	must(t, s, "zfs", "create", "zroot/keel/jails")
	must(t, s, "zfs", "create", "zroot/keel/volumes")
	return s, root
}

// TestProvisionAndDelete walks a VNET jail with two volumes and limits
// through the provision order of docs/freebsd-notes.md §1.9 and the delete
// order of §1.8/§1.7, checking the state and the texts at each step.
func TestProvisionAndDelete(t *testing.T) {
	s, root := host(t)
	const base, rootfs, path = "zroot/keel/base/test", "zroot/keel/jails/web", "/zroot/keel/jails/web"

	// 1-2: base exists, snapshot race-free path, clone.
	if got := must(t, s, "zfs", "list", "-H", "-o", "name", base); got != base+"\n" {
		t.Fatalf("zfs list = %q", got)
	}
	res := run(t, s, "zfs", "list", "-H", "-o", "name", base+"@keel")
	if res.Code != 1 || string(res.Stderr) != "cannot open 'zroot/keel/base/test@keel': dataset does not exist\n" {
		t.Fatalf("missing snapshot: %d %q", res.Code, res.Stderr)
	}
	must(t, s, "zfs", "snapshot", base+"@keel")
	must(t, s, "zfs", "clone", base+"@keel", rootfs)
	if _, err := os.Stat(filepath.Join(root, path, "sbin/route")); err != nil {
		t.Fatalf("clone not populated: %v", err)
	}
	// A refreshed base does not change an existing clone.
	if err := os.WriteFile(filepath.Join(root, "zroot/keel/base/test/new"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// 3: the jail.
	must(t, s, "jail", "-c", "name=keel-web", "path="+path, "vnet", "mount.devfs", "devfs_ruleset=4", "persist")
	if got := must(t, s, "jls", "-j", "keel-web", "jid"); got != "1\n" {
		t.Fatalf("jls jid = %q", got)
	}
	if got := must(t, s, "jls", "-j", "keel-web", "path"); got != path+"\n" {
		t.Fatalf("jls path = %q", got)
	}
	// 4: two volumes with quotas, nullfs-mounted.
	for _, v := range []string{"data", "logs"} {
		if err := os.MkdirAll(filepath.Join(root, path, v), 0o755); err != nil {
			t.Fatal(err)
		}
		if res := run(t, s, "zfs", "list", "-H", "-o", "name", "zroot/keel/volumes/"+v); res.Code != 1 {
			t.Fatalf("volume exists before create: %d", res.Code)
		}
		must(t, s, "zfs", "create", "-o", "quota=64M", "zroot/keel/volumes/"+v)
		if strings.Contains(must(t, s, "mount", "-p"), path+"/"+v) {
			t.Fatalf("mounted before mount")
		}
		must(t, s, "mount", "-t", "nullfs", "/zroot/keel/volumes/"+v, path+"/"+v)
		if got := must(t, s, "zfs", "get", "-H", "-o", "value", "quota", "zroot/keel/volumes/"+v); got != "64M\n" {
			t.Fatalf("quota = %q", got)
		}
	}
	if got := must(t, s, "mount", "-p"); !strings.Contains(got, "/zroot/keel/volumes/data /zroot/keel/jails/web/data nullfs\trw,nfsv4acls \t0 0\n") {
		t.Fatalf("mount -p:\n%s", got)
	}
	// 5: bridge, epair, addressing, default route.
	if res := run(t, s, "ifconfig", "keel0"); res.Code != 1 || string(res.Stderr) != "ifconfig: interface keel0 does not exist\n" {
		t.Fatalf("ifconfig keel0: %d %q", res.Code, res.Stderr)
	}
	if got := must(t, s, "ifconfig", "bridge", "create"); got != "bridge0\n" {
		t.Fatalf("bridge create = %q", got)
	}
	if got := must(t, s, "ifconfig", "bridge0", "name", "keel0"); got != "keel0\n" {
		t.Fatalf("rename = %q", got)
	}
	must(t, s, "ifconfig", "keel0", "up")
	must(t, s, "ifconfig", "keel0", "inet", "10.0.60.1/24", "alias")
	if got := must(t, s, "ifconfig", "epair1", "create"); got != "epair1a\n" {
		t.Fatalf("epair create = %q", got)
	}
	must(t, s, "ifconfig", "keel0", "addm", "epair1a")
	must(t, s, "ifconfig", "epair1a", "up")
	must(t, s, "ifconfig", "epair1b", "vnet", "keel-web")
	must(t, s, "jexec", "keel-web", "/sbin/ifconfig", "epair1b", "inet", "10.0.60.5/24")
	must(t, s, "jexec", "keel-web", "/sbin/ifconfig", "epair1b", "up")
	if got := must(t, s, "jexec", "keel-web", "/sbin/route", "add", "default", "10.0.60.1"); got != "add net default: gateway 10.0.60.1\n" {
		t.Fatalf("route add = %q", got)
	}
	if got := must(t, s, "jexec", "keel-web", "/sbin/route", "-n", "get", "default"); !strings.Contains(got, "gateway: 10.0.60.1") {
		t.Fatalf("route get:\n%s", got)
	}
	if got := must(t, s, "ifconfig", "keel0"); !strings.Contains(got, "inet 10.0.60.1 netmask 0xffffff00 broadcast 10.0.60.255") || !strings.Contains(got, "member: epair1a") {
		t.Fatalf("ifconfig keel0:\n%s", got)
	}
	// 6: limits.
	must(t, s, "rctl", "-a", "jail:keel-web:pcpu:deny=200")
	must(t, s, "rctl", "-a", "jail:keel-web:vmemoryuse:deny=512M")
	if got := must(t, s, "rctl", "jail:keel-web"); got != "jail:keel-web:pcpu:deny=200\njail:keel-web:vmemoryuse:deny=536870912\n" {
		t.Fatalf("rctl = %q", got)
	}
	must(t, s, "rctl", "-a", "jail:keel-web:pcpu:deny=100") // replaces, not duplicates
	if got := must(t, s, "rctl", "jail:keel-web"); strings.Count(got, "pcpu") != 1 {
		t.Fatalf("rctl after re-add = %q", got)
	}
	// 7: the workload.
	p, err := s.Start([]string{"jexec", "keel-web", "/bin/sleep", "300"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := must(t, s, "ps", "-J", "1", "-o", "state="); got != "SJ\n" {
		t.Fatalf("ps state = %q", got)
	}
	if leaks := s.State().Leaks("keel-web"); len(leaks) != 0 {
		t.Fatalf("leaks after provision: %q", leaks)
	}
	if _, err := os.Stat(filepath.Join(root, path, "new")); err == nil {
		t.Fatal("a file added to the base after @keel reached the clone")
	}

	// Delete, §1.8: detach, jail -r, umount devfs, reap, volumes, destroy, rctl.
	must(t, s, "ifconfig", "epair1a", "destroy")
	if s.State().Iface("keel-web", "epair1b") != nil {
		t.Fatal("destroying epair1a left epair1b")
	}
	must(t, s, "jail", "-r", "keel-web")
	if got := must(t, s, "ps", "-J", "1", "-o", "state="); got != "ZJ\n" {
		t.Fatalf("killed process not a zombie before reaping: %q", got)
	}
	// devfs stays mounted after jail -r (§1.7 step 3).
	if !strings.Contains(must(t, s, "mount", "-p"), path+"/dev") {
		t.Fatal("jail -r unmounted devfs")
	}
	must(t, s, "umount", path+"/dev")
	for _, v := range []string{"data", "logs"} {
		must(t, s, "umount", path+"/"+v)
	}
	// The zombie still holds the root: §1.7 step 4, §10.1.
	res = run(t, s, "zfs", "destroy", rootfs)
	if res.Code != 1 || string(res.Stderr) != "cannot unmount '/zroot/keel/jails/web': pool or dataset is busy\n" {
		t.Fatalf("destroy with an unreaped zombie: %d %q", res.Code, res.Stderr)
	}
	if code, _ := p.Wait(); code != -1 {
		t.Fatalf("wait = %d, want -1 (signal)", code)
	}
	must(t, s, "zfs", "destroy", rootfs)
	must(t, s, "rctl", "-r", "jail:keel-web")
	st := s.State()
	if leaks := st.Leaks(); len(leaks) != 0 {
		t.Fatalf("leaks after delete: %q", leaks)
	}
	if st.Datasets["zroot/keel/volumes/data"] == nil {
		t.Fatal("volume destroyed by jail delete")
	}
	if _, err := os.Stat(filepath.Join(root, path)); !os.IsNotExist(err) {
		t.Fatalf("root directory left: %v", err)
	}
}

// TestLeaksFindsLeftovers checks that Leaks reports what a careless delete
// leaves behind.
func TestLeaksFindsLeftovers(t *testing.T) {
	s, root := host(t)
	must(t, s, "zfs", "snapshot", "zroot/keel/base/test@keel")
	must(t, s, "zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/a")
	must(t, s, "jail", "-c", "name=keel-a", "path=/zroot/keel/jails/a", "vnet", "mount.devfs", "persist")
	must(t, s, "ifconfig", "epair3", "create")
	must(t, s, "ifconfig", "epair3b", "vnet", "keel-a")
	must(t, s, "rctl", "-a", "jail:keel-a:pcpu:deny=50")
	must(t, s, "ifconfig", "em0", "alias", "192.0.2.99", "netmask", "255.255.255.255")
	must(t, s, "route", "add", "-net", "10.0.207.0/24", "192.0.2.20")
	must(t, s, "jail", "-r", "keel-a")
	_ = root
	got := strings.Join(s.State().Leaks(), "\n")
	for _, want := range []string{"epair epair3a", "dataset zroot/keel/jails/a", "mount devfs on /zroot/keel/jails/a/dev", "alias 192.0.2.99/32", "route 10.0.207.0/24", "rctl rule jail:keel-a:pcpu:deny=50"} {
		if !strings.Contains(got, want) {
			t.Errorf("Leaks misses %q in:\n%s", want, got)
		}
	}
	if l := s.State().LeaksExpect(Expect{VIPs: []string{"192.0.2.99"}, Routes: []string{"10.0.207.0/24"}}); strings.Contains(strings.Join(l, "\n"), "alias") || strings.Contains(strings.Join(l, "\n"), "route 10.0.207") {
		t.Fatalf("expected VIP/route reported: %q", l)
	}
}

func writeFile(root, p, content string) error {
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	return os.WriteFile(full, []byte(content), 0o644)
}

// TestHooks checks IgnoreTerm (jail -r waits stop.timeout, then kills),
// Crash, kill -s TERM and a Start of a command missing from the jail.
func TestHooks(t *testing.T) {
	s, _ := host(t)
	must(t, s, "zfs", "snapshot", "zroot/keel/base/test@keel")
	must(t, s, "zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/a")
	must(t, s, "jail", "-c", "name=keel-a", "path=/zroot/keel/jails/a", "persist")
	p1, _ := s.Start([]string{"jexec", "keel-a", "/bin/sleep", "1"}, nil, nil)
	s.Crash("keel-a", 7)
	if code, _ := p1.Wait(); code != 7 {
		t.Fatalf("crash code %d", code)
	}
	p2, _ := s.Start([]string{"jexec", "keel-a", "sleep", "1"}, nil, nil)
	s.IgnoreTerm("keel-a")
	must(t, s, "kill", "-s", "TERM", strconv.Itoa(p2.Pid()))
	if got := must(t, s, "ps", "-p", strconv.Itoa(p2.Pid()), "-o", "state="); got != "SJ\n" {
		t.Fatalf("TERM not ignored: %q", got)
	}
	start := time.Now()
	must(t, s, "jail", "-r", "keel-a")
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("jail -r did not wait stop.timeout for a TERM-ignoring process (%v)", d)
	}
	if code, _ := p2.Wait(); code != -1 {
		t.Fatalf("code %d", code)
	}
	must(t, s, "jail", "-c", "name=keel-a", "path=/zroot/keel/jails/a", "persist")
	f, err := os.CreateTemp(t.TempDir(), "err")
	if err != nil {
		t.Fatal(err)
	}
	p3, _ := s.Start([]string{"jexec", "keel-a", "/usr/local/bin/missing"}, nil, f)
	if code, _ := p3.Wait(); code != 1 {
		t.Fatalf("missing command code %d", code)
	}
	if b, _ := os.ReadFile(f.Name()); string(b) != "jexec: execvp: /usr/local/bin/missing: No such file or directory\n" {
		t.Fatalf("stderr %q", b)
	}
}
