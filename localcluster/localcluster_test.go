package localcluster

import (
	"slices"
	"testing"
	"time"
)

// TestAgentCommand: the driver option becomes the agents' --driver, and
// each node's agent gets its own NodeEnv (a FreeBSD host's simulator root)
// and no other node's, followed by what Start is given.
func TestAgentCommand(t *testing.T) {
	c := &Cluster{Options: Options{Dir: "/x", Keel: "/bin/keel", Poll: time.Second, Driver: "freebsd",
		AgentArgs: []string{"--pool", "tank"},
		NodeEnv: map[string][]string{
			"n1": {"KEEL_FBSDSIM_ROOT=/x/hosts/n1"},
			"n2": {"KEEL_FBSDSIM_ROOT=/x/hosts/n2"},
		}}, Bare: "/x/cluster.git"}
	cmd := c.agentCommand("n1", []string{"KEEL_CRASH_AT=after-process-start"})
	i := slices.Index(cmd.Args, "--driver")
	if i < 0 || i+1 >= len(cmd.Args) || cmd.Args[i+1] != "freebsd" {
		t.Errorf("args %q: want --driver freebsd", cmd.Args)
	}
	if !slices.Contains(cmd.Args, "tank") || !slices.Contains(cmd.Args, "/x/nodes/n1") {
		t.Errorf("args %q: want the agent args and n1's state directory", cmd.Args)
	}
	root := slices.Index(cmd.Env, "KEEL_FBSDSIM_ROOT=/x/hosts/n1")
	crash := slices.Index(cmd.Env, "KEEL_CRASH_AT=after-process-start")
	if root < 0 || crash < root || slices.Contains(cmd.Env, "KEEL_FBSDSIM_ROOT=/x/hosts/n2") {
		t.Errorf("env %q: want n1's NodeEnv, then the crash point, and not n2's", cmd.Env)
	}

	c.Driver = ""
	if cmd := c.agentCommand("n2", nil); slices.Contains(cmd.Args, "--driver") {
		t.Errorf("args %q: no --driver without Options.Driver (the agent's default, process)", cmd.Args)
	}
}
