package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	gosync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// publication is one report the loop hands the publisher, with where and
// how often to push it.
type publication struct {
	report report.Report
	// builtAt is the local clock when the loop built the report: a
	// heartbeat dates the report builtAt-relative, keeping the offset
	// between the report's time and the local clock (the clock rule's).
	builtAt    time.Time
	prefix     string
	reportRepo string        // "" for the spec repository
	interval   time.Duration // the report interval
	ttl        time.Duration // livenessTTL: a longer gap between pushes starts a new run
}

// publisher pushes this node's report. It has a repository of its own
// (<state>/publish, or <state>/publish-reports for a separate report
// repository) and its own goroutine, so that a push never waits behind a
// fetch (a large commit can take tens of seconds to fetch) nor behind a
// reconcile pass: a node busy fetching or reconciling still looks alive.
//
// The loop hands it the newest report through one slot (a newer report
// replaces one not sent yet). Between hand-offs, a heartbeat of its own
// republishes the last report with a fresh time every report interval, as
// long as the loop handed it one within staleAfter plus the report
// interval (with a ring the loop hands an unchanged report only once an
// interval): an agent whose loop is stuck stops looking alive, as /healthz
// stops saying it is.
//
// publish is safe for concurrent use; close stops the goroutine and waits
// for it.
type publisher struct {
	node       string
	stateDir   string
	remote     sync.Remote
	timeout    time.Duration
	signer     ssh.Signer
	now        func() time.Time
	log        *slog.Logger
	metrics    *Metrics
	staleAfter time.Duration

	wake    chan struct{}
	mu      gosync.Mutex
	pending *publication // the newest report not yet taken by run
	// pushedRun is the Since and Time of the last report pushed: the
	// unbroken run the peers see (zero before the first push).
	pushedRun struct{ since, at time.Time }

	// announce, when set, tells the gossip ring the content version of a
	// report just pushed whose content changed (report.ContentDigest), so
	// that the peers fetch it now; a heartbeat is not announced.
	announce func(digest string)
	// stalled, when set, is called when the heartbeat stops because the
	// loop handed no report for staleAfter: with a gossip ring, the node
	// must stop looking alive there too.
	stalled func()

	cancel context.CancelFunc
	wg     gosync.WaitGroup
}

func newPublisher(opts Options, log *slog.Logger, metrics *Metrics, staleAfter time.Duration, announce func(digest string), stalled func()) *publisher {
	remote := opts.Remote
	remote.Branch, remote.FullHistory = "", false // it only ever pushes report refs
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{
		node: opts.Node, stateDir: opts.StateDir, remote: remote, timeout: opts.GitTimeout,
		signer: opts.ReportSigner, now: opts.Now, log: log, metrics: metrics, staleAfter: staleAfter,
		wake: make(chan struct{}, 1), cancel: cancel, announce: announce, stalled: stalled,
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx)
	}()
	return p
}

// publish hands over the newest report; it never blocks.
func (p *publisher) publish(pub publication) {
	p.mu.Lock()
	p.pending = &pub
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// settledFor is how long this node's unbroken run of reports had lasted
// in the last report pushed (its Time minus its Since): what the peers
// judge settling by (planner.SettlePeriod). It is zero before the first
// push, and after a gap of more than the TTL since the last push (the
// next push starts a new run).
func (p *publisher) settledFor(now time.Time, ttl time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pushedRun.since.IsZero() || now.Sub(p.pushedRun.at) > ttl {
		return 0
	}
	return p.pushedRun.at.Sub(p.pushedRun.since)
}

// runSince is the Since a report dated t carries when pushed now: the
// start of the unbroken run of reports pushed, or t itself when none was
// pushed within ttl before t (a new run starts). The drains'
// acknowledgements carry it (drainAcks), as the pushed copies do.
func (p *publisher) runSince(t time.Time, ttl time.Duration) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pushedRun.since.IsZero() || t.Sub(p.pushedRun.at) > ttl || p.pushedRun.since.After(t) {
		return t
	}
	return p.pushedRun.since
}

// close stops the publisher and waits for it, after the push under way if
// there is one (bounded by the git timeout): go-git cannot always abandon
// a push to a local repository (it kills git-receive-pack and then waits
// for its children, which wait for it), so a push is never cancelled.
func (p *publisher) close() {
	p.cancel()
	p.wg.Wait()
}

func (p *publisher) run(ctx context.Context) {
	var (
		mirror  *sync.Mirror
		openFor string // the report repository the mirror was opened on, and its prefix
		last    *publication
		pushed  time.Time // local clock of the last successful push
		// run is this node's unbroken run of reports (report.Since):
		// since is its first report's Time, last the Time of the newest
		// report pushed. A gap of more than livenessTTL between two
		// pushes (peers may have held the node dead meanwhile) starts a
		// new run, as does the agent's start.
		run       struct{ since, last time.Time }
		announced string // the content version last announced
		failed    bool
		stale     bool // the heartbeat stopped: the loop has not handed a report for staleAfter
	)
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxElapsedTime = 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
		p.mu.Lock()
		fresh := p.pending
		p.pending = nil
		p.mu.Unlock()
		now := p.now()
		var r report.Report
		switch {
		case fresh != nil:
			last, r, stale = fresh, fresh.report, false
		case last == nil:
			continue
		case now.Sub(last.builtAt) > p.staleAfter+last.interval:
			// The loop hands an unchanged report once a report interval
			// (with a ring, a minute or more): only a hand-off overdue by
			// more than staleAfter means a stuck loop.
			if !stale {
				p.log.Warn("the agent loop has handed no report for a while: this node's report is no longer refreshed",
					"since", last.builtAt.Format(time.RFC3339))
				stale = true
				if p.stalled != nil {
					p.stalled()
				}
			}
			continue
		case !failed && now.Sub(pushed) < last.interval:
			// A hand-off was pushed since the timer was set.
			timer.Reset(last.interval - now.Sub(pushed))
			continue
		default:
			// Heartbeat (or retry): the last report, dated now by its clock.
			r = last.report
			r.Time = now.Add(last.report.Time.Sub(last.builtAt)).UTC().Truncate(time.Millisecond)
			if !r.Clock.IsZero() {
				r.Clock = now.UTC().Truncate(time.Millisecond)
			}
		}
		// A run never starts after the report's time (the time follows the
		// peers' clocks, so it can step back when a lead goes).
		if run.since.IsZero() || r.Time.Sub(run.last) > last.ttl || run.since.After(r.Time) {
			run.since = r.Time
		}
		r.Since = run.since
		retry.MaxInterval = last.interval
		if key := last.reportRepo + "\x00" + last.prefix; key != openFor {
			mirror, openFor = nil, key
		}
		nodeexec.CrashPoint(nodeexec.CrashBeforeReportPush)
		pushStart := time.Now()
		err := p.push(ctx, &mirror, last, r)
		p.log.Debug("report push", "took", time.Since(pushStart), "fresh", fresh != nil, "err", err)
		if err != nil {
			failed = true
			p.metrics.ReportPushErrors.Inc()
			p.metrics.SyncErrors.WithLabelValues("publish").Inc()
			p.log.Warn("report push failed; will retry", "err", err)
			// Open the repository afresh for the retry: nothing of a failed
			// push is trusted.
			mirror = nil
			timer.Reset(retry.NextBackOff())
			continue
		}
		failed, pushed = false, p.now()
		run.last = r.Time
		p.mu.Lock()
		p.pushedRun.since, p.pushedRun.at = r.Since, r.Time
		p.mu.Unlock()
		retry.Reset()
		p.metrics.ReportPushes.Inc()
		if d := report.ContentDigest(r); d != announced && p.announce != nil {
			announced = d
			p.announce(d)
		}
		timer.Reset(last.interval)
	}
}

func (p *publisher) push(ctx context.Context, m **sync.Mirror, pub *publication, r report.Report) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	if *m == nil {
		remote, dir := p.remote, "publish"
		if pub.reportRepo != "" {
			remote.URL, dir = pub.reportRepo, "publish-reports"
		}
		mirror, err := sync.OpenMirror(ctx, filepath.Join(p.stateDir, dir), remote, pub.prefix)
		if err != nil {
			return err
		}
		*m = mirror
	}
	data := r.Marshal()
	var sig []byte
	if p.signer != nil {
		var err error
		if sig, err = sync.SignReport(data, p.signer); err != nil {
			return fmt.Errorf("sign the report: %w", err)
		}
	}
	if _, err := (*m).PublishSigned(ctx, p.node, data, sig, r.Time); err != nil {
		return err
	}
	// Each push leaves the objects of the report it replaced: drop them
	// from time to time (sync.Mirror.NeedsCompaction), so that the
	// repository holds little more than the last report.
	if (*m).NeedsCompaction() {
		if err := (*m).Prune(); err != nil {
			p.log.Warn("pruning the publisher's repository", "err", err)
		}
	}
	return nil
}
