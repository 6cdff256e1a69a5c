//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/report"
)

// TestHostileTreesAreRefused: a push whose tree holds a symlink (its
// target text a Service) is refused by every agent with the verdict keel
// validate gives on the same checkout, and nothing of it runs (issue 8
// item 1); a push whose tree has an entry named ".." (which no checkout
// can hold) is refused too, not a failed sync, so that peers' reports are
// still read and a node that then dies is failed over (item 6).
func TestHostileTreesAreRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4*time.Minute, localcluster.Options{Files: map[string]string{
		"apps/web.yaml":     webService(4, "base/demo", "hello"),
		"jails/anchor.yaml": jail("anchor", "n1", 9900, false),
	}})
	c.converge("first commit")
	c.waitAllAlive()
	good := c.tip()
	m := c.model()
	placed := c.checkOneEach(m)

	// Item 1: the link's target is a whole Service spec. A snapshot that
	// wrote it as a file would deploy it; review sees a link.
	sneaky := "apiVersion: keel/v1\nkind: Service\nmetadata:\n  name: sneaky\nspec:\n  port: 8080\n  template:\n    image: base/demo\n    command: [/bin/sleep, \"1000\"]\n"
	if err := os.Symlink(sneaky, filepath.Join(c.Work, "apps", "sneaky.yaml")); err != nil {
		t.Fatal(err)
	}
	c.gitOut("add", "-A")
	c.gitOut("commit", "-q", "-m", "a link")
	c.gitOut("push", "-q", "origin", "main")
	link := c.tip()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), []string{"validate", "--repo", c.Work}, strings.NewReader(""), &out, &errOut)
	verdict := "apps/sneaky.yaml: not a regular file"
	if code != cli.ExitInvalid || !strings.Contains(out.String(), verdict) {
		t.Fatalf("keel validate: exit %d:\n%s%s\nwant %q", code, &out, &errOut, verdict)
	}
	c.checkRefused(good, link, verdict)

	// Item 6: a tree with an entry named "..", made with git mktree and
	// pushed as is.
	entries := c.gitOut("ls-tree", good)
	blob := c.gitOut("rev-parse", good+":cluster.yaml")
	tree := c.gitOutIn(entries+"\n100644 blob "+blob+"\t..\n", "mktree")
	dotdot := c.gitOut("commit-tree", tree, "-p", link, "-m", "an entry named ..")
	c.gitOut("push", "-q", "origin", dotdot+":refs/heads/main")
	c.checkRefused(good, dotdot, "invalid tree", "named \"..\"")

	// While the tip is refused, a node dies: its replicas move.
	var lost string
	for _, inst := range m.Instances {
		if p := placed[inst.Name]; inst.Service == "web" && p.Node != "n1" {
			lost = p.Node
		}
	}
	if lost == "" {
		t.Fatalf("no web replica outside n1: %v", placed)
	}
	c.killAgent(lost)
	c.stopInstances(lost)
	died := time.Now()
	c.waitFor("the lost node's web replicas run elsewhere, once each", func() (bool, string) {
		procs := c.procsByInstance()
		for _, inst := range m.Instances {
			if inst.Service != "web" {
				continue
			}
			if ps := procs[inst.Name]; len(ps) != 1 || ps[0].Node == lost {
				return false, fmt.Sprintf("%s runs as %v", inst.Name, ps)
			}
		}
		return true, ""
	})
	t.Logf("%s failed over %s after it died, with a refused tip", lost, time.Since(died).Round(100*time.Millisecond))
	for n, st := range c.mustStatuses() {
		if slices.ContainsFunc(st.Report.Instances, func(i report.Instance) bool { return strings.HasPrefix(i.Name, "sneaky") }) {
			t.Errorf("%s runs the Service behind the link", n)
		}
	}
}

// gitOut runs git in the work tree and returns its output.
func (c *cluster) gitOut(args ...string) string { return c.gitOutIn("", args...) }

func (c *cluster) gitOutIn(stdin string, args ...string) string {
	c.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = c.Work
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=keel e2e", "GIT_AUTHOR_EMAIL=e2e@keel.invalid",
		"GIT_COMMITTER_NAME=keel e2e", "GIT_COMMITTER_EMAIL=e2e@keel.invalid")
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}
