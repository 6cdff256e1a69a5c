package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keel-dev/keel/providers/forge"
	"github.com/keel-dev/keel/report"
)

// ForgeOptions turns on the commit statuses this node posts on the forge
// (docs/forge.md): on the commit it applied, pending while its share of
// the cluster converges and success once it runs there; on a commit it
// refused, failure with the reason.
type ForgeOptions struct {
	// Poster posts one status (a *forge.Client). Its errors must not hold
	// its credentials; forge.Temporary tells those tried again later.
	Poster interface {
		Post(context.Context, forge.Status) error
	}
	// TargetURL is the link each status carries ("" for none): a
	// dashboard, say.
	TargetURL string
	// RetryMin and RetryMax bound the wait before statuses the forge did
	// not take for a temporary reason (unreachable, 5xx, a rate limit) are
	// posted again (defaults 30 s and 10 min).
	RetryMin, RetryMax time.Duration
	// Progress is the least time between two pending statuses of a commit
	// that differ only by their description (default 10 s): a node
	// starting many instances posts its progress, not every step of it.
	Progress time.Duration
	// Settle is how long each instance placed on the node must have run
	// with the commit's spec before the node posts success (default
	// 10 s): a command that exits at once is not a deploy done.
	Settle time.Duration
}

// forgeMetrics count the posts by result, a fixed set: ok, error.
type forgeMetrics struct {
	posts *prometheus.CounterVec
}

func newForgeMetrics(reg *prometheus.Registry) *forgeMetrics {
	m := &forgeMetrics{posts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keel_forge_status_posts_total", Help: "Commit statuses posted on the forge, by result (ok, error).",
	}, []string{"result"})}
	reg.MustRegister(m.posts)
	for _, r := range []string{"ok", "error"} {
		m.posts.WithLabelValues(r)
	}
	return m
}

// forgeContext is the context of this node's statuses.
func (a *Agent) forgeContext() string { return "keel/" + a.opts.Node }

// updateForge works out, after a pass, what the forge should show of
// this node, and hands it to the forge worker when that changed: a
// status is posted when its commit, state or description change, never
// once per pass. It never waits for the forge.
func (a *Agent) updateForge() {
	if a.forge == nil {
		return
	}
	target, ctxName := a.opts.Forge.TargetURL, a.forgeContext()
	var want []forge.Status
	if a.applied != nil && a.plan != nil && a.plan.Commit == a.applied.commit {
		state, desc := a.convergence()
		cur := forge.Status{Commit: a.applied.commit, State: state, Context: ctxName, Description: desc, TargetURL: target}
		if prev := a.forgeApplied; prev != nil && prev.Commit == cur.Commit && prev.State == forge.Success {
			// Success is the deploy of the commit done on this node: a
			// crash afterwards is the instance's health (metrics, status),
			// not the deploy's, and a crash loop would otherwise flip the
			// status at every restart.
			cur = *prev
		}
		if prev := a.forgeApplied; prev != nil && prev.Commit != cur.Commit {
			// The node left a commit for a newer one: one it had not
			// converged on would stay pending on the forge for ever.
			a.forgeSuperseded = nil
			if prev.State == forge.Pending {
				a.forgeSuperseded = &forge.Status{Commit: prev.Commit, State: forge.Error, Context: ctxName, TargetURL: target,
					Description: fmt.Sprintf("superseded by %s before this node converged", short(cur.Commit))}
			}
		}
		a.forgeApplied = &cur
		want = append(want, cur)
	}
	if a.forgeSuperseded != nil {
		want = append(want, *a.forgeSuperseded)
	}
	if r := a.refused; r != nil && r.Commit != a.appliedCommit() {
		want = append(want, forge.Status{Commit: r.Commit, State: forge.Failure, Context: ctxName, TargetURL: target,
			Description: "refused: " + r.Reason})
	}
	for i := range want {
		want[i].Description = forge.Describe(want[i].Description)
	}
	if slices.Equal(want, a.forgeWant) {
		return
	}
	a.forgeWant = want
	a.forge.set(want)
}

// convergence says whether this node's share of the plan runs at the
// applied commit: every instance placed here running with the commit's
// spec, and every other one it holds stopped.
func (a *Agent) convergence() (forge.State, string) {
	m := a.applied.model
	held := a.rec.Instances()
	settle, now := cmp.Or(a.opts.Forge.Settle, 10*time.Second), a.opts.Now()
	placed := map[string]bool{}
	total, ready := 0, 0
	var behind []string
	for _, p := range a.plan.Placements {
		if p.Node != a.opts.Node {
			continue
		}
		placed[p.Instance] = true
		total++
		st, ok := held[p.Instance]
		inst := m.Instance(p.Instance)
		switch {
		case !ok:
			behind = append(behind, p.Instance+" not started")
		case st.State == report.StateRunning && inst != nil && st.SpecHash == inst.SpecHash:
			if now.Sub(st.Started) < settle {
				behind = append(behind, p.Instance+" just started")
				break
			}
			ready++
		case st.State == report.StateRunning:
			behind = append(behind, p.Instance+" to update")
		default:
			behind = append(behind, p.Instance+" "+string(st.State))
		}
	}
	stopping := 0
	for name, st := range held {
		if !placed[name] && st.State != report.StateStopped {
			stopping++
		}
	}
	if len(behind) == 0 && stopping == 0 {
		switch total {
		case 0:
			return forge.Success, "nothing to run on this node"
		case 1:
			return forge.Success, "1 instance runs at this commit"
		}
		return forge.Success, fmt.Sprintf("%d instances run at this commit", total)
	}
	slices.Sort(behind)
	desc := fmt.Sprintf("converging: %d of %d running", ready, total)
	if len(behind) > 0 {
		desc += "; " + strings.Join(behind, ", ")
	}
	if stopping > 0 {
		desc += fmt.Sprintf("; %d to stop", stopping)
	}
	if m.Cluster.Suspend {
		desc = "cluster suspended, " + desc
	}
	return forge.Pending, desc
}

// forgeWorker posts the statuses the loop hands it, from a goroutine of
// its own, so that a slow or unreachable forge never holds up a pass or a
// report. The loop hands the whole set it wants through one slot: a newer
// set replaces one not taken yet (latest wins), and only the statuses that
// differ from what the forge was last given are posted. Statuses the
// forge did not take for a temporary reason are posted again after a
// backoff; those it refused (a wrong token, a missing repository) wait
// for the next change, and are logged.
//
// set is safe for concurrent use; close stops the goroutine, cancelling a
// post under way, and waits for it.
type forgeWorker struct {
	poster   func(context.Context, forge.Status) error
	log      *slog.Logger
	metrics  *forgeMetrics
	retry    *backoff.ExponentialBackOff
	progress time.Duration

	wake  chan struct{}
	mu    gosync.Mutex
	want  []forge.Status
	fresh bool // want was set and not taken yet

	cancel context.CancelFunc
	wg     gosync.WaitGroup
}

func newForgeWorker(opts ForgeOptions, log *slog.Logger, metrics *forgeMetrics) *forgeWorker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &forgeWorker{
		poster: opts.Poster.Post, log: log, metrics: metrics,
		retry: backoff.NewExponentialBackOff(backoff.WithInitialInterval(cmp.Or(opts.RetryMin, 30*time.Second)),
			backoff.WithMaxInterval(cmp.Or(opts.RetryMax, 10*time.Minute)), backoff.WithMaxElapsedTime(0)),
		progress: cmp.Or(opts.Progress, 10*time.Second),
		wake:     make(chan struct{}, 1), cancel: cancel,
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.run(ctx)
	}()
	return w
}

// set hands over the statuses wanted now; it never blocks.
func (w *forgeWorker) set(want []forge.Status) {
	w.mu.Lock()
	w.want, w.fresh = want, true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *forgeWorker) close() {
	w.cancel()
	w.wg.Wait()
}

func (w *forgeWorker) run(ctx context.Context) {
	// posted is, by commit, the status the forge was last given (or
	// refused for good: not tried again until it changes).
	posted := map[string]forge.Status{}
	postedAt := map[string]time.Time{}
	var want []forge.Status
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer.C:
		}
		w.mu.Lock()
		if w.fresh {
			want, w.fresh = w.want, false
		}
		w.mu.Unlock()
		done, later := w.sync(ctx, want, posted, postedAt)
		switch {
		case ctx.Err() != nil:
		case !done:
			timer.Reset(w.retry.NextBackOff())
		case later > 0:
			w.retry.Reset()
			timer.Reset(later)
		default:
			w.retry.Reset()
			timer.Stop()
		}
	}
}

// sync posts what in want the forge was not given yet. It reports
// whether nothing is left to try again after a failure, and how long to
// wait before progress held back (Progress) is due.
func (w *forgeWorker) sync(ctx context.Context, want []forge.Status, posted map[string]forge.Status, postedAt map[string]time.Time) (done bool, later time.Duration) {
	done = true
	for _, st := range want {
		prev, ok := posted[st.Commit]
		if ok && prev == st {
			continue
		}
		if ok && prev.State == forge.Pending && st.State == forge.Pending {
			if wait := w.progress - time.Since(postedAt[st.Commit]); wait > 0 {
				if later == 0 || wait < later {
					later = wait
				}
				continue
			}
		}
		err := w.poster(ctx, st)
		if ctx.Err() != nil {
			return false, 0 // stopping
		}
		if err != nil {
			w.metrics.posts.WithLabelValues("error").Inc()
			temporary := forge.Temporary(err)
			w.log.Warn("posting the commit status on the forge failed", "commit", short(st.Commit), "state", string(st.State),
				"retry", temporary, "err", err)
			if temporary {
				done = false
				continue
			}
		} else {
			w.metrics.posts.WithLabelValues("ok").Inc()
			w.log.Debug("commit status posted on the forge", "commit", short(st.Commit), "state", string(st.State), "description", st.Description)
		}
		posted[st.Commit], postedAt[st.Commit] = st, time.Now()
	}
	for commit := range posted {
		if !slices.ContainsFunc(want, func(s forge.Status) bool { return s.Commit == commit }) {
			delete(posted, commit)
			delete(postedAt, commit)
		}
	}
	return done, later
}
