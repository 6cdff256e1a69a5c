package sync_test

import (
	"bytes"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/sync"
)

// fuzzObjects are the objects every fuzzed tree may name: a cluster.yaml,
// a node, a valid nodes/ tree and a blob past render.MaxFileSize.
type fuzzObjects struct {
	objs                               []plumbing.EncodedObject
	cluster, node, nodes, large, empty plumbing.Hash
}

func newFuzzObjects(t testing.TB) *fuzzObjects {
	o := &fuzzObjects{}
	add := func(typ plumbing.ObjectType, data []byte) plumbing.Hash {
		obj := &plumbing.MemoryObject{}
		obj.SetType(typ)
		if _, err := obj.Write(data); err != nil {
			t.Fatal(err)
		}
		o.objs = append(o.objs, obj)
		return obj.Hash()
	}
	o.cluster = add(plumbing.BlobObject, []byte(treeCluster))
	o.node = add(plumbing.BlobObject, []byte(treeNode))
	o.large = add(plumbing.BlobObject, bytes.Repeat([]byte("#"), render.MaxFileSize+1))
	o.nodes = add(plumbing.TreeObject, encodeTree(t, object.TreeEntry{Name: "n1.yaml", Mode: filemode.Regular, Hash: o.node}))
	o.empty = add(plumbing.TreeObject, nil)
	return o
}

// encodeTree encodes entries in git's order (a tree's name sorts as if
// it ended with "/").
func encodeTree(t testing.TB, entries ...object.TreeEntry) []byte {
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	entries = slices.Clone(entries)
	slices.SortStableFunc(entries, func(a, b object.TreeEntry) int { return strings.Compare(key(a), key(b)) })
	obj := &plumbing.MemoryObject{}
	if err := (&object.Tree{Entries: entries}).Encode(obj); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	r, _ := obj.Reader()
	buf.ReadFrom(r)
	return buf.Bytes()
}

// FuzzCommitFS feeds the raw bytes of a root tree object to CommitFS:
// reading it (listing every directory, opening every entry, and
// render.ReadFiles) never panics; every name it lists is one a checkout
// can hold, once per directory; every error is an *fs.PathError naming a
// valid path (or fs.ErrInvalid for a name that is not UTF-8), opening an
// entry that is not a blob is render.ErrNotRegular; what ReadFiles returns
// is within the size limits.
func FuzzCommitFS(f *testing.F) {
	o := newFuzzObjects(f)
	e := func(name string, mode filemode.FileMode, h plumbing.Hash) object.TreeEntry {
		return object.TreeEntry{Name: name, Mode: mode, Hash: h}
	}
	valid := []object.TreeEntry{e("cluster.yaml", filemode.Regular, o.cluster), e("nodes", filemode.Dir, o.nodes)}
	seeds := [][]object.TreeEntry{
		valid,
		append(valid, e("large.yaml", filemode.Regular, o.large)),
		append(valid, e("link.yaml", filemode.Symlink, o.node)),
		append(valid, e("sub", filemode.Submodule, o.node)),
		append(valid, e("x", filemode.Executable, o.node)),
		append(valid, e("..", filemode.Dir, o.nodes)),
		append(valid, e(".GIT", filemode.Dir, o.nodes)),
		append(valid, e("nodes", filemode.Regular, o.node)),
		append(valid, e("a", filemode.Dir, o.node)),
		append(valid, e("b.yaml", filemode.Regular, o.nodes)),
		append(valid, e("c", filemode.Dir, o.empty)),
		append(valid, e("missing.yaml", filemode.Regular, plumbing.NewHash("0123456789abcdef0123456789abcdef01234567"))),
	}
	for _, s := range seeds {
		raw := encodeTree(f, s...)
		f.Add(raw)
		f.Add(raw[:len(raw)-7])
	}
	f.Add([]byte("100644 a\x00short"))
	f.Add([]byte("40000 d\x00" + strings.Repeat("\xff", 20) + "100644 d\x00" + strings.Repeat("\x01", 20)))

	f.Fuzz(func(t *testing.T, raw []byte) {
		st := memory.NewStorage()
		repo, err := gogit.Init(st, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range o.objs {
			if _, err := st.SetEncodedObject(obj); err != nil {
				t.Fatal(err)
			}
		}
		treeObj := st.NewEncodedObject()
		treeObj.SetType(plumbing.TreeObject)
		w, _ := treeObj.Writer()
		w.Write(raw)
		w.Close()
		root, err := st.SetEncodedObject(treeObj)
		if err != nil {
			t.Fatal(err)
		}
		who := object.Signature{Name: "f", Email: "f@example.com", When: time.Unix(0, 0)}
		commitObj := st.NewEncodedObject()
		if err := (&object.Commit{Author: who, Committer: who, TreeHash: root, Message: "fuzz\n"}).Encode(commitObj); err != nil {
			t.Fatal(err)
		}
		ch, err := st.SetEncodedObject(commitObj)
		if err != nil {
			t.Fatal(err)
		}
		c, err := object.GetCommit(st, ch)
		if err != nil {
			t.Fatal(err)
		}
		fsys, err := sync.CommitFS(repo, c, "")
		if err != nil {
			t.Fatalf("CommitFS: %v", err)
		}
		checkErr := func(err error) {
			t.Helper()
			var pe *fs.PathError
			if !errors.As(err, &pe) {
				t.Fatalf("%T %v is not an *fs.PathError", err, err)
			}
			// A name that is not UTF-8 is listed, but no fs.FS opens it
			// (DirFS neither): both readers refuse it as fs.ErrInvalid.
			if !fs.ValidPath(pe.Path) && !errors.Is(err, fs.ErrInvalid) {
				t.Fatalf("error names %q: %v", pe.Path, err)
			}
		}
		err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				checkErr(err)
				return nil
			}
			if d.IsDir() {
				entries, err := fs.ReadDir(fsys, p)
				if err != nil {
					checkErr(err)
					return fs.SkipDir
				}
				seen := map[string]bool{}
				for _, de := range entries {
					n := de.Name()
					if n == "" || n == "." || n == ".." || strings.EqualFold(n, ".git") || strings.ContainsAny(n, "/\x00") || seen[n] {
						t.Fatalf("%s lists the entry %q", p, n)
					}
					seen[n] = true
				}
				return nil
			}
			data, err := fs.ReadFile(fsys, p)
			switch {
			case err == nil:
				if !d.Type().IsRegular() {
					t.Fatalf("%s (%v) was read as a file", p, d.Type())
				}
				if len(data) > render.MaxFileSize {
					t.Fatalf("%s read at %d bytes", p, len(data))
				}
			case !fs.ValidPath(p):
				checkErr(err)
			case !d.Type().IsRegular() && !errors.Is(err, render.ErrNotRegular):
				t.Fatalf("%s (%v): %v, want ErrNotRegular", p, d.Type(), err)
			default:
				checkErr(err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk: %v", err)
		}
		files, err := render.ReadFiles(fsys)
		if err != nil {
			return
		}
		total := 0
		for _, file := range files {
			if !fs.ValidPath(file.Path) || len(file.Data) > render.MaxFileSize {
				t.Fatalf("ReadFiles returned %q (%d bytes)", file.Path, len(file.Data))
			}
			total += len(file.Data)
		}
		if total > render.MaxRepoSize {
			t.Fatalf("ReadFiles returned %d bytes", total)
		}
	})
}
