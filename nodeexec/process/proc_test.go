package process

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		file      string
		want      procStat
		wantAlive bool
	}{
		{"stat-leader", procStat{State: 'R', PPID: 20597, PGID: 20597, StartTime: 247708}, true},
		{"stat-weird-comm", procStat{State: 'S', PPID: 23264, PGID: 23258, StartTime: 258267}, true},
		{"stat-newline-comm", procStat{State: 'R', PPID: 28190, PGID: 28190, StartTime: 269056}, true},
		{"stat-zombie", procStat{State: 'Z', PPID: 23268, PGID: 23258, StartTime: 258296}, false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseStat(readTestdata(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("parseStat = %+v, want %+v", got, tc.want)
			}
			if got.alive() != tc.wantAlive {
				t.Errorf("alive = %v, want %v", got.alive(), tc.wantAlive)
			}
		})
	}
}

func TestParseStatRejectsMalformed(t *testing.T) {
	full := strings.TrimSpace(string(readTestdata(t, "stat-leader")))
	for name, in := range map[string]string{
		"empty":             "",
		"no parentheses":    "1 cat R 1 1 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5",
		"unclosed":          "1 (cat R 1 1",
		"too few fields":    "1 (cat) R 1 1 0 0",
		"state not letter":  strings.Replace(full, ") R ", ") RR ", 1),
		"pgrp not a number": strings.Replace(full, "20597 20597", "20597 x", 1),
		"starttime signed":  strings.Replace(full, " 247708 ", " -5 ", 1),
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := parseStat([]byte(in)); err == nil {
				t.Errorf("parseStat(%q) = %+v, want an error", in, got)
			}
		})
	}
}

func FuzzParseStat(f *testing.F) {
	for _, name := range []string{"stat-leader", "stat-weird-comm", "stat-newline-comm", "stat-zombie"} {
		f.Add(readTestdata(f, name))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseStat(b)
		if err == nil && st.State == 0 {
			t.Errorf("parseStat(%q) accepted an empty state", b)
		}
	})
}

func TestParseSelfStat(t *testing.T) {
	st, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != os.Getppid() || !st.alive() || st.StartTime == 0 {
		t.Errorf("our own stat = %+v (ppid %d)", st, os.Getppid())
	}
}

func TestParseMemTotal(t *testing.T) {
	got, err := parseMemTotal(readTestdata(t, "meminfo"))
	if err != nil || got != 24683652<<10 {
		t.Errorf("parseMemTotal = %d, %v; want %d", got, err, int64(24683652)<<10)
	}
	for _, in := range []string{"", "MemFree: 5 kB\n", "MemTotal: 12\n", "MemTotal: x kB\n", "MemTotal: 5 MB\n", "MemTotal: -5 kB\n"} {
		if got, err := parseMemTotal([]byte(in)); err == nil {
			t.Errorf("parseMemTotal(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseBootTime(t *testing.T) {
	got, err := parseBootTime(readTestdata(t, "procstat"))
	if err != nil || !got.Equal(time.Unix(1795966046, 0)) {
		t.Errorf("parseBootTime = %v, %v", got, err)
	}
	for _, in := range []string{"", "cpu 1 2 3\n", "btime x\n", "btime -1\n"} {
		if got, err := parseBootTime([]byte(in)); err == nil {
			t.Errorf("parseBootTime(%q) = %v, want an error", in, got)
		}
	}
}

func TestParseEnviron(t *testing.T) {
	in := "PATH=/bin\x00KEEL_DRIVER_ROOT=/state\x00KEEL_INSTANCE=web-0\x00KEEL_INSTANCE=second\x00" +
		"KEEL_VOLUME_DATA=/state/volumes/data\x00KEEL_SPEC_HASH=abc\x00junk\x00KEEL_VOLUME_LOGS=/state/volumes/logs\x00"
	got := parseEnviron([]byte(in))
	want := marker{Root: "/state", Instance: "web-0", SpecHash: "abc", Volumes: []string{"/state/volumes/data", "/state/volumes/logs"}}
	if got.Root != want.Root || got.Instance != want.Instance || got.SpecHash != want.SpecHash || !slices.Equal(got.Volumes, want.Volumes) {
		t.Errorf("parseEnviron = %+v, want %+v", got, want)
	}
	if got := parseEnviron(nil); got.Root != "" || got.Instance != "" {
		t.Errorf("parseEnviron(nil) = %+v", got)
	}
}
