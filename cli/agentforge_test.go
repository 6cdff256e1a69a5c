//go:build unix

package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/providers/forge/forgetest"
)

func TestAgentForgeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open-token")
	if err := os.WriteFile(open, []byte("t0ken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	gitea := []string{"--forge-kind", "gitea", "--forge-url", "https://git.example.com", "--forge-repo", "acme/cluster"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a forge URL without a kind", []string{"--forge-url", "https://git.example.com"}, "--forge-url is for an agent that posts commit statuses"},
		{"an unknown kind", []string{"--forge-kind", "bitbucket"}, "want one of github, gitea, forgejo, gitlab"},
		{"no repository", []string{"--forge-kind", "github", "--forge-token-file", token}, "--forge-kind needs --forge-repo"},
		{"no token file", []string{"--forge-kind", "github", "--forge-repo", "a/b"}, "--forge-kind needs --forge-token-file"},
		{"gitea without a URL", []string{"--forge-kind", "gitea", "--forge-repo", "a/b", "--forge-token-file", token}, "needs --forge-url"},
		{"a token others can read", append(gitea, "--forge-token-file", open), "chmod 600"},
		{"a token file that is a FIFO", append(gitea, "--forge-token-file", fifo), "not a regular file"},
		{"plain http to a remote forge", []string{"--forge-kind", "gitlab", "--forge-url", "http://gitlab.example.com", "--forge-repo", "7", "--forge-token-file", token}, "in clear"},
		{"a target URL that is not one", append(gitea, "--forge-token-file", token, "--forge-target-url", "javascript:alert(1)"), "--forge-target-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", t.TempDir(), "--driver", "fake"}, tc.args...)
			code, _, stderr := keelWithin(t, 10*time.Second, args...)
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want a refusal with %q", code, stderr, tc.want)
			}
			if strings.Contains(stderr, "t0ken") {
				t.Errorf("the token is in the error: %q", stderr)
			}
		})
	}
}

// A FIFO given for a node-local file is refused at once rather than
// hanging the agent's start waiting for a writer (--acme-ca-roots read it
// with a blocking open before).
func TestAgentConfigFileFIFODoesNotHang(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "roots.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", t.TempDir(), "--driver", "fake",
		"--ingress-http", "127.0.0.1:0", "--ingress-https", "127.0.0.1:0", "--acme-ca-roots", fifo}
	code, _, stderr := keelWithin(t, 10*time.Second, args...)
	if code == 0 || !strings.Contains(stderr, "not a regular file") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// keel agent with the forge flags posts its node's status on the commit
// it applied, to a stand-in Gitea, with the token from its file.
func TestAgentPostsForgeStatus(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	work, bare := t.TempDir(), filepath.Join(t.TempDir(), "c.git")
	files := map[string]string{
		"cluster.yaml":  "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n",
		"nodes/n1.yaml": "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1, capacity: {cpu: \"8\", memory: 8G}}\n",
		"apps/a.yaml":   "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: a}\nspec: {image: base/x, command: [/bin/a]}\n",
	}
	for name, content := range files {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun := func(dir string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	gitRun(work, "init", "-q", "-b", "main")
	gitRun(work, "add", "-A")
	gitRun(work, "commit", "-q", "-m", "init")
	gitRun(work, "init", "-q", "--bare", "-b", "main", bare)
	gitRun(work, "push", "-q", bare, "main")
	commit := gitRun(work, "rev-parse", "HEAD")

	const token = "gitea-t0ken-0123456789"
	srv := forgetest.New(t, forgetest.Gitea, token, "acme/cluster")
	tokenFile := filepath.Join(t.TempDir(), "forge-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"agent", "--repo", bare, "--node", "n1", "--state-dir", t.TempDir(), "--driver", "fake",
			"--poll", "100ms", "--reconcile-interval", "100ms", "--log-level", "debug",
			"--forge-kind", "forgejo", "--forge-url", srv.URL, "--forge-repo", "acme/cluster", "--forge-token-file", tokenFile,
			"--forge-target-url", "https://dash.example.com/"}, strings.NewReader(""), &bytes.Buffer{}, &errOut)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, ok := srv.Latest(commit, "keel/n1"); ok && st.State == "success" {
			if st.Description != "1 instance runs at this commit" || st.TargetURL != "https://dash.example.com/" {
				t.Errorf("status %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no success status on %s; statuses %+v, refused %v\n%s", commit, srv.Statuses(commit), srv.Refused(), errOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("agent exit %d\n%s", code, errOut.String())
	}
	if strings.Contains(errOut.String(), token) {
		t.Error("the token is in the agent's logs")
	}
}
