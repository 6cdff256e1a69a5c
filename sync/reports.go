package sync

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// ReportRef returns the ref a node publishes its report on.
func ReportRef(prefix, node string) plumbing.ReferenceName {
	return plumbing.ReferenceName(prefix + node)
}

// RemoteReportPrefix is where the report refs fetched from remote land:
// refs/keel/remotes/<remote>/reports/<node>. It is outside refs/remotes/ on
// purpose: there, a branch named keel/reports/<node> would pass for a
// report, and git fetch --prune would delete them.
func RemoteReportPrefix(remote string) string {
	return "refs/keel/remotes/" + remote + "/reports/"
}

// ReadReports reads the reports found in repo, on the local report refs
// (prefix + node) and on those fetched from remotes (RemoteReportPrefix).
// A report that cannot be read or
// that speaks for another node is skipped and described in problems;
// callers show those as warnings.
func ReadReports(repo *git.Repository, prefix string) (reports []report.Report, problems []string, err error) {
	return ReadVerifiedReports(repo, prefix, nil)
}

// ReadVerifiedReports is ReadReports where the report of a node listed in
// keys counts only with a valid signature by that key; one without is
// skipped and described in problems.
func ReadVerifiedReports(repo *git.Repository, prefix string, keys ReportKeys) (reports []report.Report, problems []string, err error) {
	refs, err := repo.References()
	if err != nil {
		return nil, nil, fmt.Errorf("list refs: %w", err)
	}
	defer refs.Close()
	err = refs.ForEach(func(ref *plumbing.Reference) error {
		name := ref.Name().String()
		node, ok := strings.CutPrefix(name, prefix)
		if !ok {
			// refs/keel/remotes/<remote>/reports/<node>; a remote's name
			// may itself contain slashes.
			rest, remote := strings.CutPrefix(name, "refs/keel/remotes/")
			i := strings.LastIndex(rest, "/reports/")
			if !remote || i < 0 {
				return nil
			}
			node = rest[i+len("/reports/"):]
		}
		// A name ending in .lock is never a ref: it is git writing one
		// (go-git lists those files too).
		if node == "" || strings.Contains(node, "/") || strings.HasSuffix(node, ".lock") || ref.Type() != plumbing.HashReference {
			return nil
		}
		r, err := readReport(repo, ref.Hash(), node, keys)
		if err != nil {
			problems = append(problems, fmt.Sprintf("report of %s on %s ignored: %v", node, name, err))
			return nil
		}
		reports = append(reports, r)
		return nil
	})
	// Several refs may hold reports of one node (local and fetched): all
	// are returned, and the planner keeps the newest that is not dated in
	// the future, whatever the order here.
	slices.SortFunc(reports, func(a, b report.Report) int { return strings.Compare(a.Node, b.Node) })
	return reports, problems, err
}

// The largest report and signature read: a report is checked against
// them from the objects' headers, before anything is inflated, so that a
// small object that inflates to gigabytes (a decompression bomb) costs
// nothing but that node's report.
const (
	MaxReportSize    = 4 << 20
	MaxSignatureSize = 64 << 10
	// maxPublishedTree bounds the tree of a report commit (two entries)
	// or a certificate commit (three).
	maxPublishedTree = 4 << 10
)

// readReport reads report.yaml from the commit h, published for node, and
// checks its signature when the node has a report key. Every object is
// refused from its header when it is larger than it can be.
func readReport(repo *git.Repository, h plumbing.Hash, node string, keys ReportKeys) (report.Report, error) {
	files, err := openPublished(repo, h)
	if err != nil {
		return report.Report{}, err
	}
	data, err := files.read(report.FileName, MaxReportSize)
	if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound) {
		return report.Report{}, fmt.Errorf("no %s in commit %s", report.FileName, h)
	}
	if err != nil {
		return report.Report{}, err
	}
	var sig []byte
	if keys[node] != nil {
		sig, err = files.read(SigFileName, MaxSignatureSize)
		if err != nil && !errors.Is(err, object.ErrEntryNotFound) {
			return report.Report{}, err
		}
	}
	return VerifiedReport(data, sig, node, keys)
}

// VerifiedReport reads node's report from data and its detached signature
// sig, however they came (git, or the gossip ring's drain
// acknowledgements): both bounded (MaxReportSize, MaxSignatureSize), the
// signature checked when the node has a report key, the report parsed
// strictly and published for node.
func VerifiedReport(data, sig []byte, node string, keys ReportKeys) (report.Report, error) {
	if len(data) > MaxReportSize || len(sig) > MaxSignatureSize {
		return report.Report{}, fmt.Errorf("report of %d bytes or signature of %d: larger than %d or %d", len(data), len(sig), MaxReportSize, MaxSignatureSize)
	}
	if key := keys[node]; key != nil {
		if err := VerifyReport(data, sig, key); err != nil {
			return report.Report{}, err
		}
	}
	return report.Parse(data, node)
}

// published is the tree of a commit a node published (a report, a shared
// certificate), read file by file within bounds.
type published struct {
	s    storer.EncodedObjectStorer
	tree *object.Tree
}

// openPublished reads the commit h and its tree, each refused from its
// header when larger than it can be.
func openPublished(repo *git.Repository, h plumbing.Hash) (published, error) {
	s := repo.Storer
	c, err := readCommit(s, h)
	if err != nil {
		return published{}, fmt.Errorf("read commit: %w", err)
	}
	if err := checkSize(s, c.TreeHash, maxPublishedTree); err != nil {
		return published{}, fmt.Errorf("read tree: %w", err)
	}
	tree, err := object.GetTree(s, c.TreeHash)
	if err != nil {
		return published{}, fmt.Errorf("read tree: %w", err)
	}
	return published{s: s, tree: tree}, nil
}

// read returns the file name, a regular file of at most max bytes; a
// missing one is object.ErrEntryNotFound.
func (p published) read(name string, max int64) ([]byte, error) {
	e, err := p.tree.FindEntry(name)
	if err != nil {
		return nil, err
	}
	if e.Mode != filemode.Regular && e.Mode != filemode.Executable {
		return nil, fmt.Errorf("%s: %w", name, render.ErrNotRegular)
	}
	data, err := readBlob(p.s, e.Hash, max)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return data, nil
}

// FetchReports fetches the report refs of remote into RemoteReportPrefix,
// since a clone (a CI checkout, say) does not fetch refs outside refs/heads/
// and refs/tags/. It runs git itself when it is installed, so that the
// credentials git is configured with (credential helpers, the extra header
// of CI checkouts) apply; otherwise it uses go-git with the remote's URL.
func FetchReports(ctx context.Context, repo *git.Repository, dir, remote, prefix string) error {
	spec := "+" + prefix + "*:" + RemoteReportPrefix(remote) + "*"
	if gitBin, err := exec.LookPath("git"); err == nil {
		cmd := exec.CommandContext(ctx, gitBin, "-C", dir, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", remote, spec)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("fetch reports from %s: %w: %s", remote, err, RedactURL(errors.New(strings.TrimSpace(string(out)))))
		}
		return nil
	}
	guardTransports()
	err := repo.FetchContext(ctx, &git.FetchOptions{RemoteName: remote, RefSpecs: []config.RefSpec{config.RefSpec(spec)}, Tags: git.NoTags})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("fetch reports from %s: %w", remote, RedactURL(err))
	}
	return nil
}
