package sync_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-dev/keel/sync"
)

// sshKey makes an ed25519 key pair with ssh-keygen and returns the private
// key's path and the public key line.
func sshKey(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed")
	}
	key := filepath.Join(dir, name)
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return key, strings.TrimSpace(string(pub))
}

// signedCommit makes a commit in repo, signed with key (unsigned when key
// is ""), by committer email.
func signedCommit(t *testing.T, repo, key, email, msg string) {
	t.Helper()
	args := []string{"-c", "gpg.format=ssh", "-c", "user.name=T", "-c", "user.email=" + email}
	if key != "" {
		args = append(args, "-c", "user.signingkey="+key)
	}
	args = append(args, "commit", "-q", "--allow-empty", "-m", msg)
	if key != "" {
		args = append(args, "-S")
	} else {
		args = append(args, "--no-gpg-sign")
	}
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_COMMITTER_EMAIL="+email)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git commit: %v\n%s", err, out)
	}
}

func TestVerifySSHSignedCommits(t *testing.T) {
	dir := t.TempDir()
	alice, alicePub := sshKey(t, dir, "alice")
	mallory, _ := sshKey(t, dir, "mallory")
	_, bobPub := sshKey(t, dir, "bob")
	signers, err := sync.ParseAllowedSigners(strings.NewReader(
		"# deployers\n" +
			"alice@example.com " + alicePub + "\n" +
			`bob@example.com namespaces="file" ` + bobPub + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	repo := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	cases := []struct {
		name, key, email, want string
	}{
		{"signed by a listed key", alice, "alice@example.com", ""},
		{"unsigned", "", "alice@example.com", "not signed"},
		{"an unlisted key", mallory, "alice@example.com", "not an allowed signer"},
		{"a listed key for another principal", alice, "eve@example.com", "may not sign for eve@example.com"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			signedCommit(t, repo, c.key, c.email, c.name)
			r, err := sync.OpenRepo(repo)
			if err != nil {
				t.Fatal(err)
			}
			commit, err := sync.ResolveCommit(r, "HEAD")
			if err != nil {
				t.Fatal(err)
			}
			principal, err := signers.Verify(commit)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "" && principal != c.email:
				t.Fatalf("principal %q", principal)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestWrongNamespaceRefused(t *testing.T) {
	dir := t.TempDir()
	bob, bobPub := sshKey(t, dir, "bob")
	signers, err := sync.ParseAllowedSigners(strings.NewReader(`bob@example.com namespaces="file" ` + bobPub + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	repo := commitTree(t, map[string]string{"a": "1"})
	signedCommit(t, repo, bob, "bob@example.com", "signed")
	r, _ := sync.OpenRepo(repo)
	c, _ := sync.ResolveCommit(r, "HEAD")
	if _, err := signers.Verify(c); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("a key limited to namespace file signed a commit: %v", err)
	}
}

func TestTamperedCommitRefused(t *testing.T) {
	dir := t.TempDir()
	alice, alicePub := sshKey(t, dir, "alice")
	signers, _ := sync.ParseAllowedSigners(strings.NewReader("alice@example.com " + alicePub + "\n"))
	repo := commitTree(t, map[string]string{"a": "1"})
	signedCommit(t, repo, alice, "alice@example.com", "the real message")
	// Rewrite the commit object with another message but the same signature.
	raw := git(t, repo, "", "cat-file", "commit", "HEAD")
	forged := strings.Replace(raw, "the real message", "a forged message", 1)
	h := git(t, repo, forged+"\n", "hash-object", "-t", "commit", "-w", "--stdin")
	r, _ := sync.OpenRepo(repo)
	c, err := sync.ResolveCommit(r, h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Verify(c); err == nil || !strings.Contains(err.Error(), "bad signature") {
		t.Fatalf("a tampered commit passed: %v", err)
	}
}

func TestParseAllowedSignersErrors(t *testing.T) {
	for _, bad := range []string{"", "# only a comment\n", "alice@example.com\n", "alice@example.com cert-authority ssh-ed25519 AAAA\n", "a ssh-ed25519 notbase64\n"} {
		if _, err := sync.ParseAllowedSigners(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
