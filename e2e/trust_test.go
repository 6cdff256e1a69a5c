package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestVerifiedDeploys: with --verify-signatures on every agent, an unsigned
// push is refused by all three nodes, and a signed one deploys.
func TestVerifiedDeploys(t *testing.T) {
	t.Parallel()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed")
	}
	keys := t.TempDir()
	key := filepath.Join(keys, "deployer")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	pub, _ := os.ReadFile(key + ".pub")
	signers := filepath.Join(keys, "allowed_signers")
	// localcluster commits as demo@keel.invalid.
	if err := os.WriteFile(signers, []byte("demo@keel.invalid "+string(pub)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3*time.Minute, localcluster.Options{
		AgentArgs: []string{"--verify-signatures", "--allowed-signers", signers},
		Files:     map[string]string{"apps/web.yaml": webService(2, "base/demo", "hello")},
	})
	// The first commit, made by localcluster, is unsigned: nothing runs.
	// Sign a commit on top of it and push.
	commit := func(sign bool, file, content, msg string) string {
		if err := os.WriteFile(filepath.Join(c.Work, file), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"-c", "gpg.format=ssh", "-c", "user.signingkey=" + key, "commit", "-q", "-a", "-m", msg}
		if sign {
			args = append(args, "-S")
		} else {
			args = append(args, "--no-gpg-sign")
		}
		for _, a := range [][]string{{"add", "-A"}, args, {"push", "-q", "origin", "main"}} {
			cmd := exec.Command("git", a...)
			cmd.Dir = c.Work
			cmd.Env = append(os.Environ(), "GIT_COMMITTER_EMAIL=demo@keel.invalid", "GIT_AUTHOR_EMAIL=demo@keel.invalid")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("git %v: %v\n%s", a, err, out)
			}
		}
		tip, _ := c.Tip()
		return tip
	}
	commit(true, "apps/web.yaml", webService(2, "base/demo", "signed"), "signed")
	c.converge("a signed commit")

	unsigned := commit(false, "apps/web.yaml", webService(3, "base/demo", "unsigned"), "unsigned")
	c.waitFor("every node refusing the unsigned commit", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range c.Nodes {
			r := sts[n].Report.Refused
			if r == nil || r.Commit != unsigned || !strings.Contains(r.Reason, "not signed") {
				return false, n + " has not refused it"
			}
		}
		return true, ""
	})
	for _, n := range c.Nodes {
		st, _ := c.Status(c.ctx, n)
		for _, in := range st.Report.Instances {
			if in.Name == "web-2" {
				t.Fatalf("%s runs web-2 from the unsigned commit", n)
			}
		}
	}
	// Unsigned pushes of large files cost no disk: the signature is
	// checked before the tree is read, and a refused commit is never
	// snapshotted (issue 8 item 7).
	refused := []string{unsigned}
	for i := range 4 {
		pad := "# " + strings.Repeat("x", 3<<20) + "\n"
		refused = append(refused, commit(false, fmt.Sprintf("pad%d.yaml", i), pad, "unsigned and large"))
	}
	last := refused[len(refused)-1]
	c.waitFor("every node refusing the last unsigned commit", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		for _, n := range c.Nodes {
			if r := sts[n].Report.Refused; r == nil || r.Commit != last || !strings.Contains(r.Reason, "not signed") {
				return false, n + " has not refused it"
			}
		}
		return true, ""
	})
	for _, n := range c.Nodes {
		entries, err := os.ReadDir(filepath.Join(c.StateDir(n), "specs"))
		if err != nil {
			t.Fatal(err)
		}
		var snaps []string
		for _, e := range entries {
			snaps = append(snaps, e.Name())
			if slices.Contains(refused, e.Name()) {
				t.Errorf("%s snapshotted the refused commit %s", n, e.Name())
			}
		}
		if len(snaps) > 2 {
			t.Errorf("%s keeps %d snapshots: %v", n, len(snaps), snaps)
		}
	}
	commit(true, "apps/web.yaml", webService(3, "base/demo", "signed again"), "signed again")
	c.converge("a signed commit after an unsigned one")
}
