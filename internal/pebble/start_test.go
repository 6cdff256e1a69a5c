//go:build unix

package pebble

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestAPortTakenMeanwhileIsNoticed: another process binds a port between
// Start picking it and a child binding it. challtestsrv only logs that
// and runs on, Pebble exits; either way start says so with an error
// Start retries on, and leaves no process behind.
func TestAPortTakenMeanwhileIsNoticed(t *testing.T) {
	pebbleBin, challBin, err := Build(DefaultDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, which := range []struct {
		name string
		slot int // index into start's ports
	}{{"challtestsrv's DNS", 0}, {"pebble's directory", 2}} {
		t.Run(which.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Dir: dir, PebbleBin: pebbleBin, ChallBin: challBin, IP: "127.0.0.1",
				DefaultIPv4: "127.0.0.1", StartTimeout: 20 * time.Second}
			wfe, err := writeWFECert(dir, opts.IP)
			if err != nil {
				t.Fatal(err)
			}
			ports, err := freePorts(opts.IP, 6)
			if err != nil {
				t.Fatal(err)
			}
			taken, err := net.Listen("tcp", net.JoinHostPort(opts.IP, strconv.Itoa(ports[which.slot])))
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			s, err := start(opts, wfe, ports)
			if err == nil {
				s.Close()
				t.Fatal("start succeeded on a taken port")
			}
			if !errors.Is(err, errAddrInUse) && !errors.Is(err, errEarlyExit) {
				t.Fatalf("start: %v; want an error Start retries on", err)
			}
			if pids := runningIn(t, dir); len(pids) != 0 {
				t.Fatalf("processes %v left running after a failed start", pids)
			}
		})
	}
}

// runningIn lists the processes whose working directory is dir.
func runningIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc to find the children in")
	}
	var pids []string
	for _, e := range ents {
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && cwd == dir {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
