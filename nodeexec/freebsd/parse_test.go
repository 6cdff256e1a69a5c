package freebsd

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// The parsers are tested on the outputs in testdata/ (testdata/README.md
// cites the source of each format) and on what must be refused, and
// fuzzed: whatever a command prints, a parser never panics.

func captured(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseJID(t *testing.T) {
	for _, tc := range []struct {
		out  string
		jid  int
		want bool
	}{
		{string(captured(t, "jls-j-jid.out")), 3, true},
		{"  12  \n", 12, true},
		{"", 0, false},
		{"0\n", 0, false},
		{"-1\n", 0, false},
		{"3 4\n", 0, false},
		{"jls: jail \"keel-x\" not found\n", 0, false},
	} {
		if jid, ok := parseJID([]byte(tc.out)); jid != tc.jid || ok != tc.want {
			t.Errorf("parseJID(%q) = %d, %v; want %d, %v", tc.out, jid, ok, tc.jid, tc.want)
		}
	}
}

func TestParseJails(t *testing.T) {
	got := parseJails(captured(t, "jls-jid-name.out"))
	want := []jailEntry{{1, "keel-web-0"}, {2, "www"}, {3, "keel-db-0"}, {7, "keel-Bad_Name"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseJails = %+v, want %+v", got, want)
	}
	// A name with a space (not one of Keel's) or a line that is not a
	// JID and a name is skipped, not an error.
	got = parseJails([]byte("4 my jail\nx keel-a\n0 keel-b\n\n5 keel-c\n"))
	if want := []jailEntry{{5, "keel-c"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("parseJails of odd lines = %+v, want %+v", got, want)
	}
}

func TestParsePS(t *testing.T) {
	loc := time.FixedZone("host", 3600)
	got, err := parsePS(captured(t, "ps-J-pid-state-lstart.out"), loc)
	if err != nil {
		t.Fatal(err)
	}
	want := []psEntry{
		{812, "SsJ", time.Date(2023, 11, 14, 22, 15, 1, 0, loc)},
		{845, "IJ", time.Date(2023, 11, 14, 22, 15, 2, 0, loc)},
		{1204, "ZJ", time.Date(2023, 11, 15, 9, 5, 44, 0, loc)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsePS = %+v\nwant %+v", got, want)
	}
	if l := live(got); len(l) != 2 || l[0].PID != 812 || l[1].PID != 845 {
		t.Errorf("live = %+v: a zombie counts as running (docs/freebsd-notes.md §1.5)", l)
	}
	if got, err := parsePS(nil, loc); err != nil || len(got) != 0 {
		t.Errorf("parsePS(empty) = %v, %v", got, err)
	}
	for _, bad := range []string{
		"PID STAT STARTED\n", // a header: the -o form was wrong
		"  812 Ss\n",
		"  x Ss   Thu Nov 14 22:15:01 2023\n",
		"  812 Ss   jeu. 14 nov. 2023 22:15:01\n", // not the C locale
		"  812 Ss   Thu Nov 14 22:15:01 2023 extra\n",
	} {
		if got, err := parsePS([]byte(bad), loc); err == nil {
			t.Errorf("parsePS(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestParseMounts(t *testing.T) {
	got := parseMounts(captured(t, "mount-p.out"))
	want := []mountEntry{
		{"zroot/ROOT/default", "/", "zfs"},
		{"devfs", "/dev", "devfs"},
		{"zroot/keel/jails/web-0", "/zroot/keel/jails/web-0", "zfs"},
		{"devfs", "/zroot/keel/jails/web-0/dev", "devfs"},
		{"/zroot/keel/volumes/data", "/zroot/keel/jails/web-0/var/db", "nullfs"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseMounts = %+v\nwant %+v", got, want)
	}
	if got := parseMounts([]byte("short line\n\n")); len(got) != 0 {
		t.Errorf("parseMounts of a short line = %+v", got)
	}
}

func TestParseZFSNames(t *testing.T) {
	got := parseZFSNames(captured(t, "zfs-list-snapshots.out"))
	want := []string{"zroot/keel/base/test@keel", "zroot/keel/base/test@keel-2026-05-01"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseZFSNames = %q, want %q", got, want)
	}
	if got := parseZFSNames([]byte("\n  a/b  \nname\tused\n")); !reflect.DeepEqual(got, []string{"a/b"}) {
		t.Errorf("parseZFSNames skips blank and multi-field lines: got %q", got)
	}
}

func TestParseSysctl(t *testing.T) {
	if n, err := parseSysctlInt(captured(t, "sysctl-hw.ncpu.out")); err != nil || n != 8 {
		t.Errorf("hw.ncpu = %d, %v", n, err)
	}
	if n, err := parseSysctlInt(captured(t, "sysctl-hw.physmem.out")); err != nil || n != 17112547328 {
		t.Errorf("hw.physmem = %d, %v", n, err)
	}
	for _, bad := range []string{"", "sysctl: unknown oid 'hw.nope'\n", "1.5\n", "12 13\n"} {
		if _, err := parseSysctlInt([]byte(bad)); err == nil {
			t.Errorf("parseSysctlInt(%q) succeeded", bad)
		}
	}
	if n, err := parseBootTime(captured(t, "sysctl-kern.boottime.out")); err != nil || n != 1731622400 {
		t.Errorf("kern.boottime = %d, %v", n, err)
	}
	for _, bad := range []string{"", "1731622400\n", "{ sec = x, usec = 1 }", "{ sec = 12 }", "{ sec = -5, usec = 0 }"} {
		if _, err := parseBootTime([]byte(bad)); err == nil {
			t.Errorf("parseBootTime(%q) succeeded", bad)
		}
	}
}

func TestParseRctl(t *testing.T) {
	got, err := parseRctl(captured(t, "rctl-jail.out"))
	want := []rctlRule{
		{Subject: "jail", ID: "keel-web", Resource: "pcpu", Action: "deny", Amount: 200},
		{Subject: "jail", ID: "keel-web", Resource: "vmemoryuse", Action: "deny", Amount: 536870912},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseRctl = %+v, %v\nwant %+v", got, err, want)
	}
	// The same text the driver gives rctl -a.
	for i, r := range got {
		if line := strings.Split(string(captured(t, "rctl-jail.out")), "\n")[i]; r.String() != line {
			t.Errorf("rule %d prints %q, rctl printed %q", i, r.String(), line)
		}
	}
	if got, err := parseRctl([]byte("user:1001:maxproc:deny=100/user\n")); err != nil || got[0].Per != "user" || got[0].Amount != 100 {
		t.Errorf("a rule with a per = %+v, %v", got, err)
	}
	for _, bad := range []string{"jail:keel-web:pcpu\n", "jail:keel-web:pcpu:deny=20%\n", "jail:keel-web:pcpu:=5\n", "rctl: RACCT/RCTL present, but disabled\n"} {
		if _, err := parseRctl([]byte(bad)); err == nil {
			t.Errorf("parseRctl(%q) succeeded", bad)
		}
	}
}

func TestLimitRules(t *testing.T) {
	for _, tc := range []struct {
		cpu  int64 // millicores
		mem  int64
		want []string
		err  bool
	}{
		{2000, 512 << 20, []string{"jail:keel-web:pcpu:deny=200", "jail:keel-web:vmemoryuse:deny=536870912"}, false},
		{500, 0, []string{"jail:keel-web:pcpu:deny=50"}, false},
		{15, 0, []string{"jail:keel-web:pcpu:deny=2"}, false}, // 1.5 % rounds to 2
		{10, 0, []string{"jail:keel-web:pcpu:deny=1"}, false},
		{4, 0, nil, true}, // 0.4 % rounds to 0: pcpu:deny=0 would freeze the jail
		{1024001, 0, nil, true},
		{0, 0, nil, false},
	} {
		rules, err := limitRules("web", resources(tc.cpu, tc.mem))
		var got []string
		for _, r := range rules {
			got = append(got, r.String())
		}
		if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("limitRules(cpu %dm, memory %d) = %q, %v; want %q (error %v)", tc.cpu, tc.mem, got, err, tc.want, tc.err)
		}
	}
}

func FuzzParseJails(f *testing.F) {
	f.Add(captured(f, "jls-jid-name.out"))
	f.Add(captured(f, "jls-j-jid.out"))
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, j := range parseJails(out) {
			if j.JID <= 0 || j.Name == "" || strings.ContainsAny(j.Name, " \t\n") {
				t.Errorf("parseJails gave %+v", j)
			}
		}
		if jid, ok := parseJID(out); ok != (jid > 0) {
			t.Errorf("parseJID = %d, %v", jid, ok)
		}
	})
}

func FuzzParsePS(f *testing.F) {
	f.Add(captured(f, "ps-J-pid-state-lstart.out"))
	f.Add([]byte("1 S Mon Jan  2 15:04:05 2006\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		procs, err := parsePS(out, time.UTC)
		for _, p := range procs {
			if err == nil && (p.PID <= 0 || p.State == "") {
				t.Errorf("parsePS gave %+v", p)
			}
		}
	})
}

func FuzzParseMounts(f *testing.F) {
	f.Add(captured(f, "mount-p.out"))
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, m := range parseMounts(out) {
			for _, s := range []string{m.Device, m.Point, m.FSType} {
				if s == "" || strings.ContainsAny(s, " \t\n") {
					t.Errorf("parseMounts gave %+v", m)
				}
			}
		}
	})
}

func FuzzParseZFSList(f *testing.F) {
	f.Add(captured(f, "zfs-list-snapshots.out"))
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, n := range parseZFSNames(out) {
			if n == "" || strings.ContainsAny(n, " \t\n") {
				t.Errorf("parseZFSNames gave %q", n)
			}
		}
	})
}

func FuzzParseSysctl(f *testing.F) {
	f.Add(captured(f, "sysctl-kern.boottime.out"))
	f.Add(captured(f, "sysctl-hw.physmem.out"))
	f.Fuzz(func(t *testing.T, out []byte) {
		_, _ = parseSysctlInt(out)
		if n, err := parseBootTime(out); err == nil && n < 0 {
			t.Errorf("parseBootTime = %d", n)
		}
	})
}

func FuzzParseRctl(f *testing.F) {
	f.Add(captured(f, "rctl-jail.out"))
	f.Add([]byte("user:1001:maxproc:deny=100/user\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		rules, err := parseRctl(out)
		if err != nil {
			return
		}
		// What parses prints back to a rule that parses the same.
		for _, r := range rules {
			again, err := parseRctlRule(r.String())
			if err != nil || again != r {
				t.Errorf("%+v prints %q, which parses to %+v, %v", r, r.String(), again, err)
			}
		}
	})
}

func resources(cpuMillis, mem int64) render.Resources {
	return render.Resources{CPU: render.CPU(cpuMillis), Memory: render.Bytes(mem)}
}

func TestParseZFSGet(t *testing.T) {
	got := parseZFSGet(captured(t, "zfs-get-images.out"))
	a := "zroot/keel/images/" + strings.Repeat("1", 64) + "@keel"
	if len(got) != 3 || len(got[a]) != 6 || got[a]["keel:unpacked"] != "65568" {
		t.Fatalf("parseZFSGet = %v", got)
	}
	if v := got["zroot/keel/images/"+strings.Repeat("2", 64)+"@backup"]["com.example:note"]; v != "taken by hand" {
		t.Errorf("a value with spaces = %q", v)
	}
	if got := parseZFSGet([]byte("a\tb\tc\td\nshort\tline\n\n")); len(got) != 1 || got["a"]["b"] != "c\td" {
		t.Errorf("parseZFSGet keeps the value whole and skips short lines: %v", got)
	}
}

func TestParseDependents(t *testing.T) {
	got := parseDependents(string(captured(t, "zfs-destroy-clones.err")))
	if want := []string{"zroot/keel/jails/web-0", "zroot/keel/jails/web-1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("parseDependents = %q, want %q", got, want)
	}
	if got := parseDependents("cannot open 'x': dataset does not exist\n"); len(got) != 0 {
		t.Errorf("parseDependents of another error = %q", got)
	}
}

// The metadata of an image survives its round trip through the user
// properties of its snapshot, 40 layers too, every value short enough for
// any libzfs; a snapshot with it incomplete is no image.
func TestImageProps(t *testing.T) {
	digest := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	info := nodeexec.ImageInfo{Digest: digest("1"), Manifest: digest("2"), Size: 461, Unpacked: 65568,
		Added: time.Date(2026, 5, 2, 10, 30, 0, 0, time.UTC)}
	for i := range 40 {
		info.Layers = append(info.Layers, fmt.Sprintf("sha256:%064x", i))
	}
	props := map[string]string{}
	for _, kv := range imageProps(info) {
		k, v, _ := strings.Cut(kv, "=")
		if len(v) >= 1024 || !strings.HasPrefix(k, "keel:") {
			t.Errorf("%s: %d bytes", k, len(v))
		}
		props[k] = v
	}
	if len(props) != 5+3 {
		t.Errorf("%d properties, want 5 and 3 of layers: %v", len(props), props)
	}
	got, err := imageFromProps(info.Digest, props)
	if err != nil || !reflect.DeepEqual(got, info) {
		t.Fatalf("imageFromProps = %+v, %v\nwant %+v", got, err, info)
	}
	for _, drop := range []string{"keel:manifest", "keel:size", "keel:unpacked", "keel:added", "keel:layers", "keel:layers.1"} {
		p := maps.Clone(props)
		delete(p, drop)
		if _, err := imageFromProps(info.Digest, p); err == nil {
			t.Errorf("imageFromProps without %s took it", drop)
		}
	}
	p := maps.Clone(props)
	p["keel:layers"] = "41"
	if _, err := imageFromProps(info.Digest, p); err == nil {
		t.Error("imageFromProps took 41 layers with 40 listed")
	}
	p["keel:layers"], p["keel:layers.0"] = "40", "sha256:x,"+p["keel:layers.0"]
	if _, err := imageFromProps(info.Digest, p); err == nil {
		t.Error("imageFromProps took a layer that is no digest")
	}
	empty := nodeexec.ImageInfo{Digest: info.Digest, Manifest: info.Manifest, Added: info.Added}
	if got, err := imageFromProps(empty.Digest, parseProps(imageProps(empty))); err != nil || !reflect.DeepEqual(got, empty) {
		t.Errorf("an image without layers: %+v, %v", got, err)
	}
}

func parseProps(kvs []string) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func FuzzParseZFSGet(f *testing.F) {
	f.Add(captured(f, "zfs-get-images.out"))
	d := "sha256:" + strings.Repeat("1", 64)
	f.Add([]byte("s\tkeel:manifest\t" + d + "\ns\tkeel:size\t1\ns\tkeel:unpacked\t2\ns\tkeel:added\t2026-05-02T12:30:00.5+02:00\n" +
		"s\tkeel:layers\t2\ns\tkeel:layers.0\t" + d + "\ns\tkeel:layers.1\t" + d + "\n"))
	f.Fuzz(func(t *testing.T, out []byte) {
		for name, props := range parseZFSGet(out) {
			for k := range props {
				if name == "" || k == "" || strings.Contains(name+k, "\t") {
					t.Errorf("parseZFSGet gave %q %q", name, k)
				}
			}
			// What is taken for an image writes back as the same.
			info, err := imageFromProps("sha256:"+strings.Repeat("1", 64), props)
			if err != nil {
				continue
			}
			if again, err := imageFromProps(info.Digest, parseProps(imageProps(info))); err != nil || !reflect.DeepEqual(again, info) {
				t.Errorf("imageFromProps = %+v, which writes back as %+v, %v", info, again, err)
			}
		}
		_ = parseDependents(string(out))
	})
}
