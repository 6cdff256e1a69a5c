package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	gosync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// fetchResult is what one fetch found.
type fetchResult struct {
	err   error
	stage string // fetch or read, when err is set
	took  time.Duration
	// started is when the fetch began (the agent's clock): what it found
	// is at most that fresh, however late the loop takes it in (a fetch
	// that ends while the agent is stopped, say).
	started time.Time
	// startedAt is when the fetch began by the machine's clock, to order
	// it against this node's certificate pushes whatever Options.Now is.
	startedAt time.Time

	changedTip     bool
	changedReports bool
	commit         string
	model          *render.Model
	renderErr      error
	// files are what model was rendered from, for the snapshot written
	// when the commit is accepted.
	files []render.File
	// trustErr says why the tip is not trusted (signature, rewind); nil
	// when it is, or when verification is off.
	trustErr error
	reports  []report.Report
	problems []string
	// certsRead is set when the shared certificates were read again (an
	// agent with an ingress, when their refs or the inventory changed).
	certsRead    bool
	certs        map[string]sharedCert
	certRefs     map[string]plumbing.Hash // host → the commit of its ref, read or not
	certProblems []string
}

// gitWorker owns the fetch mirrors: every fetch runs on its goroutine, one
// at a time, and the loop never waits on the network. This node's report
// is pushed by the publisher, from a repository of its own, so that a slow
// fetch never holds it back.
type gitWorker struct {
	opts Options
	log  interface {
		Warn(string, ...any)
		Debug(string, ...any)
	}
	agent   *Agent
	fetched chan fetchResult
	// acks are the reports received over the ring: a report the ring
	// announces that came that way already is not fetched (nil: none).
	acks *drainAcks

	wake chan struct{}
	mu   gosync.Mutex
	// Pending work, coalesced: one fetch.
	wantFetch    bool
	cluster      render.Cluster
	applied      string // the last applied commit, for the rewind check
	keys         sync.ReportKeys
	lastKeys     sync.ReportKeys // the keys the last read of reports used
	model        *render.Model   // the applied commit's, for the ingress nodes
	lastModel    *render.Model   // the model the last read of certificates used
	lastCertKeys sync.ReportKeys // and its keys
	// opened caches the shared certificates opened, by commit.
	opened map[string]*providers.Bundle
	// With a gossip ring: digests is the content version
	// (report.ContentDigest) of each node's report last read, tips the
	// spec tips fetched, and fetchedAt when the last fetch began. The
	// worker writes them; noticed reads them, under mu.
	digests   map[string]string
	tips      map[string]bool
	fetchedAt time.Time

	done chan struct{} // closed when run returns
}

// newGitWorker starts the worker; it stops when ctx ends, and done is
// closed once it has.
func newGitWorker(ctx context.Context, a *Agent) (*gitWorker, error) {
	w := &gitWorker{
		opts: a.opts, log: a.log, agent: a, acks: a.acks,
		fetched: make(chan fetchResult),
		wake:    make(chan struct{}, 1), cluster: a.cluster, done: make(chan struct{}),
		opened: map[string]*providers.Bundle{}, digests: map[string]string{}, tips: map[string]bool{},
	}
	go func() {
		defer close(w.done)
		w.run(ctx)
	}()
	return w, nil
}

// fetch asks for a fetch; requests made while one runs collapse into one.
func (w *gitWorker) fetch() {
	w.mu.Lock()
	w.wantFetch = true
	w.cluster = w.agent.cluster
	w.applied = w.agent.appliedCommit()
	w.keys = w.agent.reportKeys
	if w.agent.applied != nil {
		w.model = w.agent.applied.model
	}
	w.mu.Unlock()
	w.poke()
}

// worthFetching reports whether the ring announces what this node does
// not have: a peer's report content it has not read, a spec tip it has
// not fetched, or a member that died or came back since the last fetch
// began (a node cut off from the ring may still push its reports). Called
// by the loop.
func (w *gitWorker) worthFetching(k *ringKeeper) bool {
	v, on := k.members()
	return on && w.stale(v)
}

func (w *gitWorker) stale(v gossip.View) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, m := range v.Members {
		if name == w.opts.Node {
			continue
		}
		switch {
		case m.Since.After(w.fetchedAt):
			return true
		case m.Alive && m.HasMeta && m.Meta.Report != "" && m.Meta.Report != w.digests[name] && !w.acks.has(name, m.Meta.Report):
			return true
		case m.HasMeta && m.Meta.Tip != "" && !w.tips[m.Meta.Tip]:
			return true
		}
	}
	return false
}

// wants returns, with a ring, which refs a fetch asks for: the branch
// (always, when it moved), the certificates, and the report of every node
// the ring does not vouch for, alive with the content this node has read
// or received over the ring (drainAcks.has): a heartbeat of a node alive
// in the ring is not fetched. This node's own report is never fetched:
// the loop makes it afresh at each pass.
func (w *gitWorker) wants(v gossip.View, prefix string) func(plumbing.ReferenceName, plumbing.Hash) bool {
	w.mu.Lock()
	digests := maps.Clone(w.digests)
	w.mu.Unlock()
	return func(ref plumbing.ReferenceName, _ plumbing.Hash) bool {
		node, ok := strings.CutPrefix(ref.String(), prefix)
		if !ok {
			return true
		}
		if node == w.opts.Node {
			return false
		}
		m, known := v.Members[node]
		return !known || !m.Alive || !m.HasMeta || m.Meta.Report == "" || (m.Meta.Report != digests[node] && !w.acks.has(node, m.Meta.Report))
	}
}

func (w *gitWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *gitWorker) run(ctx context.Context) {
	var (
		spec, reports *sync.Mirror
		prev          sync.Refs
		prevReports   sync.Refs
		first         = true
		retry         = backoff.NewExponentialBackOff()
		notBefore     time.Time
		reportRepo    string
	)
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxElapsedTime = 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		w.mu.Lock()
		doFetch, cluster, applied, keys, model := w.wantFetch, w.cluster, w.applied, w.keys, w.model
		w.wantFetch = false
		w.mu.Unlock()
		prefix := cluster.ReportRefPrefix
		if prefix == "" {
			prefix = render.DefaultReportRefPrefix
		}
		interval := time.Duration(cluster.ReportInterval)
		if interval == 0 {
			interval = time.Duration(render.DefaultReportInterval)
		}
		retry.MaxInterval = interval
		if cluster.ReportRepo != reportRepo {
			reports, reportRepo = nil, cluster.ReportRepo
		}

		if !doFetch {
			continue
		}
		if now := time.Now(); now.Before(notBefore) {
			// Backing off after a failure: try again when the delay is over.
			time.AfterFunc(notBefore.Sub(now), w.fetchLater)
			continue
		}
		start, started := time.Now(), w.opts.Now()
		// With a ring, only what changed is fetched (see wants); the
		// members' view is taken before the fetch begins, so that what
		// changes during it is fetched next time.
		var want func(plumbing.ReferenceName, plumbing.Hash) bool
		if view, on := w.agent.ring.members(); on && cluster.Gossip != nil && !first {
			want = w.wants(view, prefix)
		}

		// A fetch under way is finished (bounded by its timeout) rather
		// than cancelled at shutdown: go-git cannot always abandon a fetch
		// from a local repository (it kills git-upload-pack, then waits for
		// its children, which wait for it).
		res := w.fetchOnce(context.WithoutCancel(ctx), &spec, &reports, reportRepo, prefix, &prev, &prevReports, first, applied, keys, model, want)
		res.took, res.started, res.startedAt = time.Since(start), started, start
		w.log.Debug("fetch", "took", res.took, "tip", res.changedTip, "reports", res.changedReports, "err", res.err)
		if res.err != nil {
			notBefore = time.Now().Add(retry.NextBackOff())
		} else {
			retry.Reset()
			notBefore = time.Time{}
			first = false
			w.fetchedWith(res, started)
		}
		select {
		case w.fetched <- res:
		case <-ctx.Done():
			return
		}
		// Compaction follows a fetch that worked (it clones afresh: with
		// the remote down it would fail too), and bounds each mirror's
		// disk use (sync.CompactBound).
		for _, m := range []*sync.Mirror{spec, reports} {
			if res.err != nil || m == nil || !m.NeedsCompaction() {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 2*w.opts.GitTimeout)
			if err := m.Compact(cctx); err != nil {
				w.log.Warn("compacting the mirror", "err", err)
			}
			cancel()
		}
	}
}

func (w *gitWorker) fetchLater() {
	w.mu.Lock()
	w.wantFetch = true
	w.mu.Unlock()
	w.poke()
}

func (w *gitWorker) open(ctx context.Context, m **sync.Mirror, dir string, remote sync.Remote, prefix string) error {
	if *m != nil {
		return nil
	}
	mirror, err := sync.OpenMirror(ctx, filepath.Join(w.opts.StateDir, dir), remote, prefix)
	if err != nil {
		return err
	}
	*m = mirror
	return nil
}

// fetchedWith records what a fetch that began at started brought, for
// noticed and wants, and announces the spec tip to the ring.
func (w *gitWorker) fetchedWith(res fetchResult, started time.Time) {
	w.mu.Lock()
	w.fetchedAt = started
	if res.commit != "" {
		if len(w.tips) >= maxTips {
			clear(w.tips)
		}
		w.tips[res.commit] = true
	}
	if res.changedReports {
		clear(w.digests)
		for _, r := range res.reports {
			w.digests[r.Node] = report.ContentDigest(r)
		}
	}
	w.mu.Unlock()
	if res.commit != "" {
		w.agent.ring.announceTip(res.commit)
	}
}

// maxTips bounds the spec tips remembered as fetched.
const maxTips = 64

func (w *gitWorker) fetchOnce(ctx context.Context, spec, reports **sync.Mirror, reportRepo, prefix string, prev, prevReports *sync.Refs, first bool, applied string, keys sync.ReportKeys, model *render.Model,
	want func(plumbing.ReferenceName, plumbing.Hash) bool) fetchResult {
	ctx, cancel := context.WithTimeout(ctx, w.opts.GitTimeout)
	defer cancel()
	fetch := func(m *sync.Mirror) (sync.Refs, error) {
		if want != nil {
			return m.FetchChanged(ctx, want)
		}
		return m.Fetch(ctx)
	}
	if err := w.open(ctx, spec, "repo", w.opts.Remote, prefix); err != nil {
		return fetchResult{err: err, stage: "fetch"}
	}
	refs, err := fetch(*spec)
	if err != nil {
		return fetchResult{err: err, stage: "fetch"}
	}
	// A tip whose objects break the fetch limits was left out of the
	// fetch: it is refused like an invalid commit, by its hash (a mirror
	// made afresh, or compacted, then has no branch of its own).
	var tipRefused error
	if refs.Refused != nil {
		refs.Tip = refs.Refused.Hash
		tipRefused = fmt.Errorf("%w: %s", render.ErrTooLarge, refs.Refused.Reason)
	}
	if refs.Tip.IsZero() {
		return fetchResult{err: errors.New("branch " + w.opts.Remote.Branch + " not found in the repository"), stage: "fetch"}
	}
	reportRefs := refs
	src := *spec
	if reportRepo != "" {
		remote := w.opts.Remote
		remote.URL, remote.Branch = reportRepo, ""
		if err := w.open(ctx, reports, "reports", remote, prefix); err != nil {
			return fetchResult{err: err, stage: "fetch"}
		}
		if reportRefs, err = fetch(*reports); err != nil {
			return fetchResult{err: err, stage: "fetch"}
		}
		src = *reports
	}
	res := fetchResult{
		changedTip:     first || refs.Tip != prev.Tip,
		changedReports: first || !sameReports(reportRefs, *prevReports),
		commit:         refs.Tip.String(),
	}
	if res.changedTip {
		// The signature is checked first: it needs the commit object
		// alone, so an untrusted push costs neither reading its tree nor
		// disk. A trusted one is rendered straight from the mirror; it is
		// snapshotted only once accepted. A commit that cannot be read
		// (too large, a link, an invalid tree) is refused like an invalid
		// one, never a failed sync: reports are read below whatever the tip.
		c, err := (*spec).Commit(refs.Tip)
		switch {
		case tipRefused != nil:
			res.renderErr = tipRefused
		case errors.Is(err, render.ErrTooLarge):
			res.renderErr = err
		case err != nil:
			return fetchResult{err: err, stage: "read"}
		default:
			if t := w.opts.Trust; t != nil {
				res.trustErr = t.check(*spec, c, applied)
			}
			if res.trustErr == nil {
				res.files, res.model, res.renderErr = renderCommit(*spec, c)
			}
		}
	}
	// Reports are checked against the report keys of the applied commit;
	// before any commit is applied, against those of a valid, trusted tip.
	if keys == nil && res.model != nil && res.renderErr == nil && res.trustErr == nil {
		keys, _ = sync.ReportKeysOf(res.model)
	}
	if !sameKeys(keys, w.lastKeys) {
		res.changedReports = true // who must sign changed: read them again
	}
	w.lastKeys = keys
	if res.changedReports {
		res.reports, res.problems, err = src.Reports(keys)
		if err != nil {
			return fetchResult{err: err, stage: "read"}
		}
		res.problems = append(res.problems, reportRefs.Skipped...)
	}
	// The shared certificates: read again when their refs, the signing
	// keys or the inventory (who may publish them) changed, and opened
	// here, off the loop.
	if ing := w.opts.Ingress; ing != nil && model == nil && res.model != nil && res.renderErr == nil && res.trustErr == nil {
		model = res.model
	}
	if ing := w.opts.Ingress; ing != nil && (first || !maps.Equal(reportRefs.Certs, prevReports.Certs) || model != w.lastModel || !sameKeys(keys, w.lastCertKeys)) {
		res.certs, res.certProblems, err = readShared(src, model, keys, ing.Identity, w.opened)
		if err != nil {
			return fetchResult{err: err, stage: "read"}
		}
		res.certsRead, res.certRefs = true, maps.Clone(reportRefs.Certs)
		w.lastModel, w.lastCertKeys = model, keys
	}
	*prev, *prevReports = refs, reportRefs
	return res
}

// renderCommit reads commit c of the mirror through the one tree reader
// and renders exactly the files it read.
func renderCommit(m *sync.Mirror, c *object.Commit) ([]render.File, *render.Model, error) {
	fsys, err := m.CommitFS(c)
	if err != nil {
		return nil, nil, err
	}
	files, err := render.ReadFiles(fsys)
	if err != nil {
		return nil, nil, err
	}
	model, err := render.RenderFiles(files)
	return files, model, err
}

func sameReports(a, b sync.Refs) bool {
	if len(a.Reports) != len(b.Reports) {
		return false
	}
	for k, v := range a.Reports {
		if b.Reports[k] != v {
			return false
		}
	}
	return true
}

func sameKeys(a, b sync.ReportKeys) bool {
	if len(a) != len(b) {
		return false
	}
	for n, k := range a {
		o, ok := b[n]
		if !ok || ssh.FingerprintSHA256(o) != ssh.FingerprintSHA256(k) {
			return false
		}
	}
	return true
}
