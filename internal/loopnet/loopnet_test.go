package loopnet

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Pairs held at once are disjoint, within a process and across processes.
func TestReserveDisjoint(t *testing.T) {
	if os.Getenv("LOOPNET_CHILD") != "" {
		p, err := Reserve()
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString(p.A.String() + "\n")
		return
	}
	seen := map[string]bool{}
	var held []*Pair
	for range 20 {
		p, err := Reserve()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
		for _, pf := range []string{p.A.String(), p.B.String()} {
			if seen[pf] {
				t.Fatalf("%s handed out twice", pf)
			}
			seen[pf] = true
		}
	}
	for range 5 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReserveDisjoint$")
		cmd.Env = append(os.Environ(), "LOOPNET_CHILD=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		a := strings.TrimSpace(strings.Split(string(out), "\n")[0])
		if seen[a] {
			t.Fatalf("another process got %s, held here", a)
		}
	}
	for _, p := range held {
		p.Release()
	}
}

// TestFreePort: the port is free for TCP and UDP on every address given,
// and one taken on any of them is never returned.
func TestFreePort(t *testing.T) {
	port, err := FreePort("127.0.0.1", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1", "127.0.0.2"} {
		ap := net.JoinHostPort(a, strconv.Itoa(port))
		tl, err := net.Listen("tcp", ap)
		if err != nil {
			t.Fatalf("TCP %s: %v", ap, err)
		}
		u, err := net.ListenPacket("udp", ap)
		tl.Close()
		if err != nil {
			t.Fatalf("UDP %s: %v", ap, err)
		}
		// Held on the second address only: that port must not come back.
		if a == "127.0.0.2" {
			defer u.Close()
			if freeOnAll([]string{"127.0.0.1", "127.0.0.2"}, port) {
				t.Fatalf("port %d held for UDP on %s counted as free", port, a)
			}
		} else {
			u.Close()
		}
	}
	if _, err := FreePort(); err == nil {
		t.Error("no address: no error")
	}
}
