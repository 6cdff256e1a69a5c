package sync_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/sync"
)

const (
	treeCluster = "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n"
	treeNode    = "apiVersion: keel/v1\nkind: Node\nmetadata: {name: n1}\nspec: {address: 192.0.2.1}\n"
	treeService = "apiVersion: keel/v1\nkind: Service\nmetadata: {name: sneaky}\nspec:\n  port: 80\n  template: {image: base/x}\n"
)

// crafted builds trees with git mktree, which writes what a hostile push
// can hold (a checkout could not).
type crafted struct {
	t   *testing.T
	dir string
}

func newCrafted(t *testing.T) *crafted {
	dir := t.TempDir()
	git(t, dir, "", "init", "-q", "-b", "main")
	return &crafted{t: t, dir: dir}
}

func (c *crafted) blob(content string) string {
	return git(c.t, c.dir, content, "hash-object", "-w", "--stdin")
}

// tree makes a tree of lines "mode type hash\tname".
func (c *crafted) tree(lines ...string) string {
	return git(c.t, c.dir, strings.Join(lines, "\n")+"\n", "mktree", "--missing")
}

func (c *crafted) entry(mode, typ, hash, name string) string {
	return fmt.Sprintf("%s %s %s\t%s", mode, typ, hash, name)
}

// base returns the entries of a valid repository's root.
func (c *crafted) base() []string {
	nodes := c.tree(c.entry("100644", "blob", c.blob(treeNode), "n1.yaml"))
	return []string{
		c.entry("100644", "blob", c.blob(treeCluster), "cluster.yaml"),
		c.entry("040000", "tree", nodes, "nodes"),
	}
}

// commitFS commits root and reads it back through CommitFS.
func (c *crafted) commitFS(root string) fs.FS {
	commit := git(c.t, c.dir, "", "commit-tree", root, "-m", "crafted")
	repo, err := sync.OpenRepo(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	co, err := sync.ResolveCommit(repo, commit)
	if err != nil {
		c.t.Fatal(err)
	}
	fsys, err := sync.CommitFS(repo, co, "")
	if err != nil {
		c.t.Fatal(err)
	}
	return fsys
}

// TestCommitFSRefusesWhatACheckoutCannotHold: every entry that is not a
// regular file or a directory, every name a checkout cannot hold, and every
// blob too large makes the commit invalid with one error naming the path,
// and nothing is rendered from it (issue 8 items 1, 5 and 6).
func TestCommitFSRefusesWhatACheckoutCannotHold(t *testing.T) {
	c := newCrafted(t)
	svc := c.blob(treeService)
	big := c.blob(strings.Repeat("#", render.MaxFileSize+1))
	head := git(t, c.dir, "", "commit-tree", c.tree(c.base()...), "-m", "x")
	apps := func(lines ...string) string { return c.entry("040000", "tree", c.tree(lines...), "apps") }
	for _, tc := range []struct {
		name  string
		extra []string
		want  error
		path  string
	}{
		{"a symlink whose target text is a Service", []string{apps(c.entry("120000", "blob", svc, "web.yaml"))}, render.ErrNotRegular, "apps/web.yaml"},
		{"a symlink to /etc/passwd", []string{c.entry("120000", "blob", c.blob("/etc/passwd"), "passwd.yaml")}, render.ErrNotRegular, "passwd.yaml"},
		{"a symlinked keel.lock", []string{c.entry("120000", "blob", c.blob("/root/.ssh/id_ed25519"), "keel.lock")}, render.ErrNotRegular, "keel.lock"},
		{"a submodule", []string{c.entry("160000", "commit", head, "vendor")}, render.ErrNotRegular, "vendor"},
		{"an entry named ..", []string{apps(c.entry("100644", "blob", svc, ".."))}, render.ErrInvalidTree, "apps"},
		{"an entry named .", []string{c.entry("100644", "blob", svc, ".")}, render.ErrInvalidTree, "."},
		{"an entry named .git", []string{apps(c.entry("040000", "tree", c.tree(c.entry("100644", "blob", svc, "config")), ".git"))}, render.ErrInvalidTree, "apps"},
		{"an entry named .GIT", []string{c.entry("100644", "blob", svc, ".GIT")}, render.ErrInvalidTree, "."},
		{"two entries with one name", []string{apps(c.entry("100644", "blob", svc, "web.yaml"), c.entry("100644", "blob", c.blob("# empty\n"), "web.yaml"))}, render.ErrInvalidTree, "apps"},
		{"a blob above the size limit", []string{c.entry("100644", "blob", big, "big.yaml")}, render.ErrTooLarge, "big.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := c.commitFS(c.tree(append(c.base(), tc.extra...)...))
			files, err := render.ReadFiles(fsys)
			var ie *render.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("ReadFiles() = %d files, %v; want an *InvalidError", len(files), err)
			}
			if len(ie.Diagnostics) != 1 || ie.Diagnostics[0].Pos.File != tc.path {
				t.Fatalf("diagnostics %v, want one at %s", ie.Diagnostics, tc.path)
			}
			if strings.Contains(err.Error(), "sneaky") || strings.Contains(err.Error(), "/etc/passwd") || strings.Contains(err.Error(), "id_ed25519") {
				t.Errorf("the error quotes the content: %v", err)
			}
			m, err := render.Render(fsys)
			if err == nil || len(m.Instances) > 0 {
				t.Errorf("Render() = %d instances, %v; want the commit refused", len(m.Instances), err)
			}
			// The FS itself says why, with the path.
			if tc.want != render.ErrInvalidTree {
				_, err := fs.ReadFile(fsys, tc.path)
				var pe *fs.PathError
				if !errors.Is(err, tc.want) || !errors.As(err, &pe) || pe.Path != tc.path {
					t.Errorf("ReadFile(%s) = %v, want %v naming the path", tc.path, err, tc.want)
				}
			}
		})
	}
}

// TestCommitFSReadsAValidTree: a valid tree reads back whole, and Render
// from the commit and from its snapshot agree.
func TestCommitFSReadsAValidTree(t *testing.T) {
	c := newCrafted(t)
	fsys := c.commitFS(c.tree(append(c.base(), c.entry("100755", "blob", c.blob(treeService), "web.yaml"))...))
	files, err := render.ReadFiles(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Path)
	}
	if want := "cluster.yaml nodes/n1.yaml web.yaml"; strings.Join(got, " ") != want {
		t.Errorf("files %q, want %s", got, want)
	}
}

// TestRepoSizeLimit: many files below the file limit still cannot add up
// to more than the repository limit.
func TestRepoSizeLimit(t *testing.T) {
	c := newCrafted(t)
	entries := c.base()
	for i := range 5 {
		// Distinct content so that each is its own blob.
		b := c.blob(fmt.Sprintf("# %d\n%s", i, strings.Repeat("#", render.MaxFileSize-16)))
		entries = append(entries, c.entry("100644", "blob", b, fmt.Sprintf("pad%d.yaml", i)))
	}
	_, err := render.ReadFiles(c.commitFS(c.tree(entries...)))
	if err == nil || !strings.Contains(err.Error(), "add up to more than 16 MiB") {
		t.Fatalf("ReadFiles() = %v, want the repository refused as too large", err)
	}
}

// TestSnapshotWritesOnlyWhatWasRead: a snapshot holds regular files only,
// 0600 in 0700 directories, exactly those render read.
func TestSnapshotWritesOnlyWhatWasRead(t *testing.T) {
	c := newCrafted(t)
	fsys := c.commitFS(c.tree(append(c.base(), c.entry("100644", "blob", c.blob("not a spec\n"), "README.md"))...))
	files, err := render.ReadFiles(fsys)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if err := sync.WriteSnapshot(dir, "abc", files); err != nil {
		t.Fatal(err)
	}
	var got []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, _ := d.Info()
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir() && info.Mode().Perm() != 0o700, !d.IsDir() && (!d.Type().IsRegular() || info.Mode().Perm() != 0o600):
			t.Errorf("%s has mode %v", rel, info.Mode())
		case !d.IsDir():
			got = append(got, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := ".keel-commit cluster.yaml nodes/n1.yaml"; strings.Join(got, " ") != want {
		t.Errorf("snapshot holds %q, want %s", got, want)
	}
	snap, err := sync.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if _, err := render.Render(snap); err != nil {
		t.Errorf("the snapshot does not render: %v", err)
	}
	if _, err := os.Stat(dir + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the temporary directory is left: %v", err)
	}
}
