package agent_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/sync"
)

// gitSigned runs git in dir as alice, signing with key when it is set.
func gitSigned(t *testing.T, dir, key string, args ...string) string {
	t.Helper()
	all := []string{"-c", "user.name=Alice", "-c", "user.email=alice@example.com", "-c", "gpg.format=ssh"}
	if key != "" {
		all = append(all, "-c", "user.signingkey="+key, "-c", "commit.gpgsign=true")
	} else {
		all = append(all, "-c", "commit.gpgsign=false")
	}
	cmd := exec.Command("git", append(all, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=Alice", "GIT_AUTHOR_EMAIL=alice@example.com",
		"GIT_COMMITTER_NAME=Alice", "GIT_COMMITTER_EMAIL=alice@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func refusal(reg *prometheus.Registry) string {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "keel_commit_refused_info" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" {
						return l.GetValue()
					}
				}
			}
		}
	}
	return ""
}

// TestVerifiedCommitsOnly: with verification on, an unsigned tip and a
// rewind to an old signed commit are refused; a signed one is applied.
func TestVerifiedCommitsOnly(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed")
	}
	bare, work := repo(t)
	keys := t.TempDir()
	key := filepath.Join(keys, "alice")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	pub, _ := os.ReadFile(key + ".pub")
	signers, err := sync.ParseAllowedSigners(strings.NewReader("alice@example.com " + string(pub)))
	if err != nil {
		t.Fatal(err)
	}
	// The first deployable commit, signed.
	gitSigned(t, work, key, "commit", "-q", "--allow-empty", "-m", "signed start")
	git(t, work, "push", "-q", bare, "main")
	signedStart := git(t, work, "rev-parse", "HEAD")

	reg := prometheus.NewRegistry()
	drv := fake.New()
	stateDir := t.TempDir()
	a, err := agent.New(agent.Options{
		Node: "n1", StateDir: stateDir, Remote: sync.Remote{URL: bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg, Poll: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond, DisableWatch: true,
		Trust: &agent.Trust{Signers: signers},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			cancel()
			<-done
			stopped = true
		}
	}
	defer stop()
	waitFor(t, "the signed commit applied", func() bool { return len(drv.Instances()) == 2 })

	addJail := func(name string) {
		f := filepath.Join(work, "apps", name+".yaml")
		os.WriteFile(f, []byte("apiVersion: keel/v1\nkind: Jail\nmetadata: {name: "+name+"}\nspec: {image: base/x, command: [/bin/c]}\n"), 0o644)
		git(t, work, "add", "-A")
	}
	// Unsigned: refused.
	addJail("c")
	gitSigned(t, work, "", "commit", "-q", "-m", "unsigned")
	git(t, work, "push", "-q", bare, "main")
	waitFor(t, "the unsigned commit refused", func() bool { return refusal(reg) == agent.RefusedUntrusted })
	if n := len(drv.Instances()); n != 2 {
		t.Fatalf("an unsigned commit changed the node: %d instances", n)
	}
	// Signed: applied.
	gitSigned(t, work, key, "commit", "-q", "--amend", "-m", "signed")
	git(t, work, "push", "-q", "-f", bare, "main")
	waitFor(t, "the signed commit applied", func() bool { return len(drv.Instances()) == 3 })
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "keel_commit_refused_info"); err != nil {
		t.Errorf("a refusal is still reported: %v", err)
	}
	// Rewind to the older signed commit: refused.
	git(t, work, "push", "-q", "-f", bare, signedStart+":refs/heads/main")
	waitFor(t, "the rewind refused", func() bool { return refusal(reg) == agent.RefusedUntrusted })
	if n := len(drv.Instances()); n != 3 {
		t.Fatalf("a rewind changed the node: %d instances", n)
	}

	// The same node restarted with --allow-rewind accepts the rollback.
	stop()
	reg2 := prometheus.NewRegistry()
	b, err := agent.New(agent.Options{
		Node: "n1", StateDir: stateDir, Remote: sync.Remote{URL: bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg2, Poll: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond, DisableWatch: true,
		Trust: &agent.Trust{Signers: signers, AllowRewind: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- b.Run(ctx2) }()
	defer func() { cancel2(); <-done2 }()
	waitFor(t, "the rewind accepted with --allow-rewind", func() bool { return len(drv.Instances()) == 2 })
}
