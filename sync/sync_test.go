package sync_test

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

func git(t *testing.T, dir string, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commitTree makes a repository whose only commit holds files.
func commitTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	git(t, dir, "", "init", "-q", "-b", "main")
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "", "add", "-A")
	git(t, dir, "", "commit", "-q", "-m", "c1")
	return dir
}

func TestCommitFSPassesFSTest(t *testing.T) {
	files := map[string]string{
		"cluster.yaml":       "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n",
		"nodes/n1.yaml":      "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1}\n",
		"apps/deep/web.yaml": "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: web}\nspec: {image: base/x}\n",
		".keelignore":        "ci/\n",
		"ci/x.yml":           "foo: bar\n",
	}
	dir := commitTree(t, files)
	repo, err := sync.OpenRepo(filepath.Join(dir, "apps"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := sync.ResolveCommit(repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := sync.CommitFS(repo, c, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := fstest.TestFS(fsys, "cluster.yaml", "nodes/n1.yaml", "apps/deep/web.yaml", "ci/x.yml"); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Open("missing.yaml"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("open of a missing file: %v", err)
	}
	// The same specs render the same from the commit and from the disk.
	fromGit, err := render.Render(fsys)
	if err != nil {
		t.Fatal(err)
	}
	fromDisk, err := render.Render(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(fromGit.Instances) != 1 || fromGit.Instances[0].SpecHash != fromDisk.Instances[0].SpecHash {
		t.Errorf("rendering from git differs from disk")
	}
	sub, err := sync.CommitFS(repo, c, "apps")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(sub, "deep/web.yaml"); err != nil {
		t.Errorf("subdirectory FS: %v", err)
	}
}

func TestReadReportsFromRefs(t *testing.T) {
	dir := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	publish := func(ref, content string) {
		blob := git(t, dir, content, "hash-object", "-w", "--stdin")
		tree := git(t, dir, "100644 blob "+blob+"\treport.yaml\n", "mktree")
		commit := git(t, dir, "", "commit-tree", tree, "-m", "report")
		git(t, dir, "", "update-ref", ref, commit)
	}
	r := report.Report{Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
	publish("refs/keel/reports/n1", string(r.Marshal()))
	r2 := report.Report{Node: "n2", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
	publish("refs/keel/remotes/origin/reports/n2", string(r2.Marshal()))
	// A branch that looks like a report ref must not pass for one.
	r6 := report.Report{Node: "n6", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
	publish("refs/remotes/origin/keel/reports/n6", string(r6.Marshal()))
	publish("refs/keel/reports/n3", string(r.Marshal())) // speaks for n1: refused
	publish("refs/keel/reports/n4", "not: [valid")
	publish("refs/heads/n5", string(r.Marshal())) // not a report ref at all

	repo, err := sync.OpenRepo(dir)
	if err != nil {
		t.Fatal(err)
	}
	reports, problems, err := sync.ReadReports(repo, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, r := range reports {
		nodes = append(nodes, r.Node)
	}
	if strings.Join(nodes, ",") != "n1,n2" {
		t.Errorf("reports from nodes %v, want n1 and n2", nodes)
	}
	if len(problems) != 2 || !strings.Contains(strings.Join(problems, "\n"), "published for node \"n3\"") {
		t.Errorf("problems: %q", problems)
	}
}

func TestRedactURL(t *testing.T) {
	err := sync.RedactURL(errors.New(`fetch https://user:s3cret@git.example.com/c.git: 403`))
	if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "git.example.com") {
		t.Errorf("not redacted: %v", err)
	}
}
