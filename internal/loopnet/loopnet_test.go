package loopnet

import (
	"os"
	"os/exec"
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
