package sync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/keel-dev/keel/report"
)

// ReportRef returns the ref a node publishes its report on.
func ReportRef(prefix, node string) plumbing.ReferenceName {
	return plumbing.ReferenceName(prefix + node)
}

// remoteReportPrefix is where report refs fetched from remote land:
// refs/remotes/<remote>/<prefix without refs/>.
func remoteReportPrefix(remote, prefix string) string {
	return "refs/remotes/" + remote + "/" + strings.TrimPrefix(prefix, "refs/")
}

// ReadReports reads every report found in repo: on the local report refs
// (prefix + node) and on those fetched from any remote. A report that cannot
// be read or that speaks for another node is skipped and described in
// problems; callers show those as warnings.
func ReadReports(repo *git.Repository, prefix string) (reports []report.Report, problems []string, err error) {
	refs, err := repo.References()
	if err != nil {
		return nil, nil, fmt.Errorf("list refs: %w", err)
	}
	defer refs.Close()
	inRemote := strings.TrimPrefix(prefix, "refs/")
	err = refs.ForEach(func(ref *plumbing.Reference) error {
		name := ref.Name().String()
		var node string
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			node = rest
		} else if rest, ok := strings.CutPrefix(name, "refs/remotes/"); ok {
			// refs/remotes/<remote>/<prefix without refs/><node>
			_, rest, _ = strings.Cut(rest, "/")
			if node, ok = strings.CutPrefix(rest, inRemote); !ok {
				return nil
			}
		} else {
			return nil
		}
		if node == "" || strings.Contains(node, "/") || ref.Type() != plumbing.HashReference {
			return nil
		}
		r, err := readReport(repo, ref.Hash(), node)
		if err != nil {
			problems = append(problems, fmt.Sprintf("report of %s on %s ignored: %v", node, name, err))
			return nil
		}
		reports = append(reports, r)
		return nil
	})
	return reports, problems, err
}

// readReport reads report.yaml from the commit h, published for node.
func readReport(repo *git.Repository, h plumbing.Hash, node string) (report.Report, error) {
	c, err := repo.CommitObject(h)
	if err != nil {
		return report.Report{}, fmt.Errorf("read commit: %w", err)
	}
	f, err := c.File(report.FileName)
	if err != nil {
		return report.Report{}, fmt.Errorf("no %s in commit %s", report.FileName, h)
	}
	rd, err := f.Reader()
	if err != nil {
		return report.Report{}, err
	}
	defer rd.Close()
	data, err := io.ReadAll(io.LimitReader(rd, 8<<20))
	if err != nil {
		return report.Report{}, err
	}
	return report.Parse(data, node)
}

// FetchReports fetches the report refs of remote into
// refs/remotes/<remote>/..., since a clone (a CI checkout, say) does not
// fetch refs outside refs/heads/ and refs/tags/.
func FetchReports(ctx context.Context, repo *git.Repository, remote, prefix string) error {
	spec := config.RefSpec("+" + prefix + "*:" + remoteReportPrefix(remote, prefix) + "*")
	err := repo.FetchContext(ctx, &git.FetchOptions{RemoteName: remote, RefSpecs: []config.RefSpec{spec}, Tags: git.NoTags})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("fetch reports from %s: %w", remote, RedactURL(err))
	}
	return nil
}
