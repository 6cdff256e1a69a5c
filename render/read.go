package render

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
)

// The limits on what a reader of a repository reads. They bound memory and
// disk whatever a commit or a checkout holds, and every reader (the agent,
// keel validate, render, plan, lock) applies the same ones, so that they
// all give the same verdict on the same tree.
const (
	// MaxFileSize is the largest file read.
	MaxFileSize = 4 << 20
	// MaxRepoSize is the most read from one repository, all files together.
	MaxRepoSize = 16 << 20
)

// The errors a tree reader (sync.CommitFS, sync.OpenDir) returns for what
// it refuses to read, wrapped in an *fs.PathError naming the path.
var (
	// ErrNotRegular is a symlink, a submodule, a FIFO, a device or
	// anything else that is not a regular file or a directory.
	ErrNotRegular = errors.New("not a regular file (symlinks, submodules, FIFOs and devices are refused)")
	// ErrTooLarge is a file above MaxFileSize, or a repository above
	// MaxRepoSize.
	ErrTooLarge = errors.New("too large")
	// ErrInvalidTree is a directory with an entry no checkout can hold:
	// an empty name, ".", "..", ".git", a name with "/" or NUL, or two
	// entries with one name.
	ErrInvalidTree = errors.New("invalid tree")
)

// File is a file of the repository as it was read.
type File struct {
	Path string
	Data []byte
}

// ReadFiles reads the files of fsys that Render reads (.keelignore,
// keel.lock and the spec files SpecFiles selects) and returns them sorted by
// path. What it refuses (an entry that is not a regular file, a file or a
// repository too large, an invalid tree) is an *InvalidError with one
// diagnostic per path, which never quotes the file. Any other error is an
// I/O failure. Without a cluster.yaml at the root nothing else is read.
//
// Every entry of the tree outside dot-directories and the paths
// .keelignore lists must be a regular file or a directory: a link is
// refused by its name, whatever it points to, so that what is reviewed is
// what is read.
func ReadFiles(fsys fs.FS) ([]File, error) {
	switch ok, err := isClusterRepo(fsys); {
	case err != nil:
		return nil, readError(err)
	case !ok:
		return nil, &InvalidError{Diagnostics: Diagnostics{missingCluster()}}
	}
	r := &reader{fsys: fsys}
	var files []File
	ignore, err := r.read(IgnoreFile)
	switch {
	case err == nil:
		files = append(files, File{Path: IgnoreFile, Data: ignore})
	case !isNotExist(err):
		return nil, readError(err)
	}
	matcher := gitignore.NewMatcher(ignorePatterns(ignore))
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return r.refuse(err)
		}
		if p == "." {
			return nil
		}
		name := d.Name()
		parts := strings.Split(p, "/")
		if d.IsDir() {
			if strings.HasPrefix(name, ".") || matcher.Match(parts, true) {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(name, ".") || matcher.Match(parts, false) {
			return nil
		}
		if !d.Type().IsRegular() {
			r.notRegular(p)
			return nil
		}
		ext := path.Ext(name)
		if p != LockFile && ext != ".yaml" && ext != ".yml" {
			return nil
		}
		data, err := r.read(p)
		if err != nil {
			return r.refuse(err)
		}
		files = append(files, File{Path: p, Data: data})
		return nil
	})
	if err != nil {
		return nil, readError(err)
	}
	if len(r.diags) > 0 {
		return nil, &InvalidError{Diagnostics: r.diags.Sort()}
	}
	return files, nil
}

// reader reads files within the limits and collects what it refuses.
type reader struct {
	fsys  fs.FS
	total int64
	diags Diagnostics
}

func (r *reader) errorf(p, format string, args ...any) {
	r.diags = append(r.diags, Diagnostic{Severity: SeverityError, Pos: Position{File: p}, Message: fmt.Sprintf(format, args...)})
}

func (r *reader) notRegular(p string) {
	switch p {
	case IgnoreFile, LockFile, ClusterFile, "cluster.yml":
		r.errorf(p, "%v", ErrNotRegular)
	default:
		r.errorf(p, "%v; list it in %s if it is not part of the cluster's specs", ErrNotRegular, IgnoreFile)
	}
}

// refuse turns a refusal of the tree reader into a diagnostic (and nil, so
// that the walk goes on and every refused path is named); other errors
// are returned.
func (r *reader) refuse(err error) error {
	p, msg := "", err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		p, msg = pe.Path, pe.Err.Error()
	}
	switch {
	case errors.Is(err, ErrNotRegular):
		r.notRegular(p)
	case errors.Is(err, ErrTooLarge):
		r.errorf(p, "%s", tooLarge(err))
	case errors.Is(err, ErrInvalidTree):
		r.errorf(p, "%s", msg)
	default:
		return err
	}
	return nil
}

func tooLarge(err error) string {
	if errors.Is(err, errRepoTooLarge) {
		return fmt.Sprintf("the repository's files add up to more than %d MiB, the most keel reads", MaxRepoSize>>20)
	}
	return fmt.Sprintf("larger than %d MiB, the largest file keel reads", MaxFileSize>>20)
}

var errRepoTooLarge = fmt.Errorf("repository %w", ErrTooLarge)

// read reads the file p, at most MaxFileSize bytes and at most what is left
// of MaxRepoSize, without trusting the size fs.Stat gives.
func (r *reader) read(p string) ([]byte, error) {
	f, err := r.fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: p, Err: ErrNotRegular}
	}
	if st.Size() > MaxFileSize {
		return nil, &fs.PathError{Op: "read", Path: p, Err: ErrTooLarge}
	}
	limit := min(int64(MaxFileSize), MaxRepoSize-r.total)
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: p, Err: err}
	}
	if int64(len(data)) > limit {
		if limit < MaxFileSize {
			return nil, &fs.PathError{Op: "read", Path: p, Err: errRepoTooLarge}
		}
		return nil, &fs.PathError{Op: "read", Path: p, Err: ErrTooLarge}
	}
	r.total += int64(len(data))
	return data, nil
}

// readError makes a refusal found outside the walk (cluster.yaml,
// .keelignore) a diagnostic too.
func readError(err error) error {
	r := &reader{}
	if e := r.refuse(err); e != nil {
		return e
	}
	return &InvalidError{Diagnostics: r.diags}
}

func missingCluster() Diagnostic {
	return Diagnostic{
		Severity: SeverityError,
		Pos:      Position{File: ClusterFile},
		Message:  fmt.Sprintf("missing: there is no %s here, so this is not a cluster repository and nothing else was read (is --repo the right directory?)", ClusterFile),
	}
}

func ignorePatterns(data []byte) []gitignore.Pattern {
	var patterns []gitignore.Pattern
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		patterns = append(patterns, gitignore.ParsePattern(line, nil))
	}
	return patterns
}
