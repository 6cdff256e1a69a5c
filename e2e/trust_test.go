package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
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
	commit(true, "apps/web.yaml", webService(3, "base/demo", "signed again"), "signed again")
	c.converge("a signed commit after an unsigned one")
}
