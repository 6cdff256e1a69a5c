// Package agent is keel agent: the loop that wires the stages together. A
// git worker fetches the cluster repository and publishes this node's
// report; the loop, the one goroutine that owns the reconciler, decides
// whether a new commit is applied, plans, reconciles, and hands the report
// back to the worker. The local API and the metrics reach the loop through
// channels only.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/probe"
	"github.com/keel-dev/keel/nodeexec/proxy"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers/forge"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// Options configures an agent.
type Options struct {
	Node     string
	StateDir string
	Remote   sync.Remote
	Driver   nodeexec.Driver
	Version  string
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Poll is the fetch interval; a local repository is also watched.
	Poll time.Duration
	// Reconcile is the interval between reconcile passes (default 5 s).
	Reconcile time.Duration
	// StopGrace is how long an instance has to stop (default 10 s).
	StopGrace time.Duration
	// GitTimeout bounds each fetch and push (default 30 s).
	GitTimeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// DisableWatch turns the fsnotify trigger off (polling only).
	DisableWatch bool
	// Trust, when set, turns commit verification on: only commits signed
	// by an allowed signer, and descending from the last applied one, are
	// applied.
	Trust *Trust
	// ReportSigner signs this node's reports (its nodes/<name>.yaml lists
	// the public half as reportKey).
	ReportSigner ssh.Signer
	// ProxyLimits bound the service proxies' clients (zero fields: the
	// defaults).
	ProxyLimits proxy.Limits
	// CheckInterval is how often the driver's host checks run, when it
	// has some (nodeexec.HostChecker); DefaultCheckInterval when zero.
	CheckInterval time.Duration
	// MaxParallelOps bounds the instance operations (volumes, start, stop,
	// destroy) that run at once, off the loop (default
	// nodeexec.DefaultMaxParallel).
	MaxParallelOps int
	// Ingress, when set, runs the node's HTTPS ingress (docs/ingress.md).
	Ingress *IngressOptions
	// Forge, when set, posts this node's deploy status on the commits it
	// applies or refuses (docs/forge.md).
	Forge *ForgeOptions
	// GossipKeyFile holds the gossip ring's keys (gossip.ReadKeys): needed
	// when cluster.yaml turns gossip on (docs/agent.md, "Gossip").
	GossipKeyFile string
	// GossipTiming overrides the failure detector's timing (tests).
	GossipTiming gossip.Timing
	// RegistryConfig is the content of a Docker-style config file with
	// the credentials of the OCI registries images are pulled from
	// (docs/images.md); nil: registries are spoken to anonymously.
	RegistryConfig []byte
	// ImageMaxCompressed and ImageMaxUnpacked bound an image's layers
	// (oci's defaults when zero); MaxPulls the pulls at once
	// (nodeexec.DefaultMaxPulls when zero).
	ImageMaxCompressed, ImageMaxUnpacked int64
	MaxPulls                             int
	// ImageGC bounds the OCI images the node keeps: checked every
	// imageGCEvery, unused images go past their grace when a bound is
	// passed (docs/images.md, "Garbage collection").
	ImageGC nodeexec.ImageGC
}

// imageGCEvery is how often the agent checks whether unused images must
// go (nodeexec.Reconciler.CollectImages, off the loop).
const imageGCEvery = time.Minute

// Trust is the node-local configuration of commit verification.
type Trust struct {
	// Signers verifies a commit's signature and returns who signed it
	// (sync.Signers, or sync.AllowedSigners for SSH only).
	Signers interface {
		Verify(*object.Commit) (string, error)
	}
	// AllowRewind accepts a tip that does not descend from the last
	// applied commit (a rollback by force push, on purpose).
	AllowRewind bool
}

// check says why commit c may not be applied, or nil.
func (t *Trust) check(m *sync.Mirror, c *object.Commit, applied string) error {
	if _, err := t.Signers.Verify(c); err != nil {
		return fmt.Errorf("untrusted commit: %w", err)
	}
	if applied == "" || applied == c.Hash.String() || t.AllowRewind {
		return nil
	}
	prev, err := m.Commit(plumbing.NewHash(applied))
	if err != nil {
		return fmt.Errorf("cannot check that it descends from the last applied commit %.12s (%v); --allow-rewind accepts it", applied, err)
	}
	ok, err := prev.IsAncestor(c)
	if err != nil {
		return fmt.Errorf("cannot check the history: %w", err)
	}
	if !ok {
		return fmt.Errorf("rewind: it does not descend from the last applied commit %.12s (an old signed commit replayed, or a force push); --allow-rewind accepts it", applied)
	}
	return nil
}

// Agent is a running keel agent.
type Agent struct {
	opts    Options
	log     *slog.Logger
	metrics *Metrics
	rec     *nodeexec.Reconciler
	proxies *proxy.Manager
	// prober runs the instances' health checks (syncChecks).
	prober *probe.Prober
	git    *gitWorker
	pub    *publisher
	checks *hostChecks   // nil when the driver has no host checks
	ing    *ingressState // nil without Options.Ingress
	forge  *forgeWorker  // nil without Options.Forge
	forgeM *forgeMetrics
	ring   *ringKeeper

	// Owned by the loop goroutine.
	applied     *appliedCommit
	tip         string // the newest commit seen
	refused     *report.Refusal
	peers       []report.Report
	peerProblem []string
	fetchedAt   time.Time // when peers were fetched, for the clock rule
	plan        *planner.Plan
	lastPublish struct {
		content string
		at      time.Time
	}
	ringHeld ringHeld // a changed report held back (with a ring)
	// ackLimit is the latest time a report over the ring may be dated to
	// count in the last pass's plan (zero without a ring).
	ackLimit time.Time
	// inFlight is how many instance operations the last pass left in
	// flight; heldSince is when a report changed while some were (see
	// publish), and settle the timer that publishes it if they last.
	inFlight  int
	heldSince time.Time
	settle    *time.Timer
	// drainFetch fetches sooner than the poll while an instance waits for
	// the other nodes' proxies to drop it (drainFetchEvery); drainPending
	// says it is set, draining that the last pass left an instance
	// draining (without a ring).
	drainFetch   *time.Timer
	drainPending bool
	draining     bool
	gitOK        bool
	gitErr       string
	cluster      render.Cluster
	restarted    map[string]int
	// waiting is what the last pass waited for (break before make), to log
	// it when it changes rather than at every pass.
	waiting string
	// unschedulable is what the last plan could not place, to log it when
	// it changes; servicesSeen the Services whose series are exported.
	unschedulable string
	// belowReplicas is the Services below their replica count, as last
	// logged ("web 2/3, db 0/1"; "" when none is).
	belowReplicas string
	// paused is the Services whose rollout the plan holds paused, as last
	// logged.
	paused string
	// peerSeen is each peer's report as last fetched (peersNews).
	// peersDirty says the peers' reports changed since savePeers last
	// wrote them, at peersSavedAt (real time); peersSavedPlaces is the
	// PlacementID of the plan made from the reports written.
	peersDirty       bool
	peersSavedAt     time.Time
	peersSavedPlaces string
	peerSeen         map[string]peerSeen
	servicesSeen     map[string]bool
	// proxied is what the service proxies were last set to, for the report.
	proxied []proxy.Service
	// forgeWant is the statuses last handed to the forge worker;
	// forgeApplied the applied commit's among them, and forgeSuperseded
	// the one of an applied commit left before it converged.
	forgeWant       []forge.Status
	forgeApplied    *forge.Status
	forgeSuperseded *forge.Status

	started     time.Time // when Run began, for the warm-up
	lastFetchOK time.Time // the last successful fetch
	// lastNoticeFetch is when the ring's news last started a fetch (real
	// time, as the timers').
	lastNoticeFetch time.Time
	// ringMinority and aliveByReports are what the last pass found of the
	// ring (noteRing).
	ringMinority, aliveByReports bool

	reportPrefix atomic.Pointer[string] // for the webhook handler
	reportKeys   sync.ReportKeys        // of the applied commit's nodes
	// acks carries drain acknowledgements over the gossip ring (Run
	// starts it; nil before).
	acks *drainAcks

	requests chan request
	trigger  chan struct{}
	health   health
}

// appliedCommit is the last good commit: its hash and rendered model.
type appliedCommit struct {
	commit string
	model  *render.Model
}

// New prepares an agent: it loads the state and the last good commit.
func New(opts Options) (*Agent, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Poll == 0 {
		opts.Poll = 10 * time.Second
	}
	if opts.Reconcile == 0 {
		opts.Reconcile = 5 * time.Second
	}
	if opts.GitTimeout == 0 {
		opts.GitTimeout = 30 * time.Second
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, err
	}
	if opts.Trust != nil {
		opts.Remote.FullHistory = true // the rewind check needs the history
	}
	puller := &oci.Puller{
		Dir: filepath.Join(opts.StateDir, "oci"), Log: opts.Logger.With("node", opts.Node),
		MaxCompressed: opts.ImageMaxCompressed, MaxUnpacked: opts.ImageMaxUnpacked,
	}
	if err := puller.Sweep(); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	if opts.RegistryConfig != nil {
		var err error
		if puller.Keychain, err = oci.KeychainFromConfig(opts.RegistryConfig); err != nil {
			return nil, err
		}
	}
	rec, err := nodeexec.NewReconciler(nodeexec.Config{
		Node: opts.Node, Driver: opts.Driver, StateDir: opts.StateDir, Logger: opts.Logger,
		Now: opts.Now, StopGrace: opts.StopGrace, MaxParallel: opts.MaxParallelOps,
		Puller: puller, MaxPulls: opts.MaxPulls, ImageGC: opts.ImageGC,
	})
	if err != nil {
		return nil, err
	}
	a := &Agent{
		opts:      opts,
		log:       opts.Logger.With("node", opts.Node),
		metrics:   NewMetrics(opts.Registry),
		rec:       rec,
		prober:    newProber(opts),
		proxies:   proxy.New(proxy.Options{Logger: opts.Logger, Metrics: proxy.NewMetrics(opts.Registry), Limits: opts.ProxyLimits}),
		requests:  make(chan request),
		trigger:   make(chan struct{}, 1),
		restarted: map[string]int{},
	}
	a.metrics.NodeInfo.WithLabelValues(opts.Node, opts.Version).Set(1)
	a.ring = newRingKeeper(a.opts, a.log, a.metrics)
	if opts.Forge != nil {
		a.forgeM = newForgeMetrics(opts.Registry)
	}
	if opts.Ingress != nil {
		if opts.Ingress.HTTP01Wait == 0 {
			a.opts.Ingress.HTTP01Wait = 2*opts.Poll + time.Second
		}
		if a.ing, err = newIngressState(a.opts); err != nil {
			_ = rec.Close()
			return nil, fmt.Errorf("ingress: %w", err)
		}
	}
	if err := a.loadLastGood(); err != nil {
		a.log.Warn("last good commit unreadable; waiting for the repository", "err", err)
	}
	if err := a.loadPeers(); err != nil {
		a.log.Warn("peers' reports unreadable; waiting for the repository", "err", err)
	}
	return a, nil
}

func (a *Agent) specsDir() string { return filepath.Join(a.opts.StateDir, "specs") }

// loadLastGood renders the snapshot of the last applied commit, so that a
// restarted agent carries on with it even while git is unreachable.
func (a *Agent) loadLastGood() error {
	data, err := os.ReadFile(filepath.Join(a.opts.StateDir, "last-good"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	commit := strings.TrimSpace(string(data))
	snap, err := sync.OpenDir(filepath.Join(a.specsDir(), commit))
	if err != nil {
		return fmt.Errorf("render last good commit %s: %w", commit, err)
	}
	defer snap.Close()
	m, err := render.Render(snap)
	if err != nil {
		return fmt.Errorf("render last good commit %s: %w", commit, err)
	}
	a.applied = &appliedCommit{commit: commit, model: m}
	a.cluster = m.Cluster
	a.setReportKeys(m)
	a.storeReportPrefix()
	a.metrics.Commit.WithLabelValues(commit).Set(1)
	return nil
}

// IngressAddrs returns the addresses the ingress listens on, by listener
// name (ingress-http, ingress-https); nil without an ingress.
func (a *Agent) IngressAddrs() map[string]string {
	if a.ing == nil {
		return nil
	}
	out := map[string]string{}
	if addr := a.ing.server.HTTPAddr(); addr != nil {
		out["ingress-http"] = addr.String()
	}
	if addr := a.ing.server.HTTPSAddr(); addr != nil {
		out["ingress-https"] = addr.String()
	}
	return out
}

// storeReportPrefix publishes the applied commit's report ref prefix to
// ReportPrefix: a copy, since the loop overwrites a.cluster with each
// commit while the webhook handler and the file watch read the prefix.
func (a *Agent) storeReportPrefix() {
	p := a.cluster.ReportRefPrefix
	a.reportPrefix.Store(&p)
}

// ReportPrefix is the report ref prefix of the applied commit (safe for
// concurrent use).
func (a *Agent) ReportPrefix() string {
	if p := a.reportPrefix.Load(); p != nil {
		return *p
	}
	return render.DefaultReportRefPrefix
}

// Trigger asks for a fetch now (webhooks, tests). It never blocks.
func (a *Agent) Trigger() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Run runs the agent until ctx ends. Instances keep running afterwards.
func (a *Agent) Run(ctx context.Context) error {
	var err error
	// The ring is left after the publisher, the git worker and the
	// drain acknowledgements stop (the defers run in reverse): they
	// announce and send through it. The acknowledgements come before the
	// git worker, which reads what came over the ring.
	defer a.ring.close()
	a.acks = newDrainAcks(a.opts.ReportSigner, a.ring, a.log, a.metrics)
	defer a.acks.close()
	gctx, cancelGit := context.WithCancel(context.Background())
	a.git, err = newGitWorker(gctx, a)
	if err != nil {
		cancelGit()
		return err
	}
	defer func() {
		cancelGit()
		<-a.git.done
	}()
	a.pub = newPublisher(a.opts, a.log, a.metrics, a.loopStallLimit(), a.ring.announceReport, a.ring.stall)
	defer a.pub.close()
	if a.applied != nil {
		a.ring.apply(a.applied.model, a.leaving())
		a.acks.setKeys(a.reportKeys, a.applied.model)
	}
	if a.opts.Forge != nil {
		a.forge = newForgeWorker(*a.opts.Forge, a.log, a.forgeM)
		defer a.forge.close()
	}
	defer a.proxies.Close()
	defer a.prober.Close()
	var certChanged chan struct{} // nil without an ingress: never ready
	if a.ing != nil {
		defer a.ing.close()
		certChanged = a.ing.changed
	}
	// The loop owns the reconciler: it closes it (cancelling the
	// operations in flight and saving what they did) before Run returns.
	defer func() {
		if err := a.rec.Close(); err != nil {
			a.log.Error("saving the state of the operations cut short", "err", err)
		}
	}()
	if local, ok := sync.LocalPath(a.opts.Remote.URL); ok && !a.opts.DisableWatch {
		// This node's own report moving is no news to it; with a ring,
		// neither is any report: the ring announces the changes, spacing
		// the fetches they start (noticeSpacing), and carries those a
		// drain or a rollout step waits for (drainAcks). A fetch at every
		// report pushed, on every node, would compete for the CPUs with
		// the rollout it reports on.
		ignore := func(ref string) bool {
			rest, ok := strings.CutPrefix(ref, a.ReportPrefix())
			return ok && (rest == a.opts.Node || a.ring.on())
		}
		if err := sync.Watch(ctx, local, a.log, ignore, a.Trigger); err != nil {
			a.log.Warn("cannot watch the local repository; polling only", "err", err)
		}
	}
	a.started = a.opts.Now()
	a.log.Info("agent started", "repo", sync.Redacted(a.opts.Remote.URL), "branch", a.opts.Remote.Branch,
		"driver", a.opts.Driver.Name(), "version", a.opts.Version)
	if hc, ok := a.opts.Driver.(nodeexec.HostChecker); ok {
		// Once before the first pass, so that the first report (and the
		// plan this node makes with it) has the host's problems.
		a.checks = newHostChecks(hc, a.log, a.metrics, a.opts.CheckInterval)
		a.checks.run(ctx)
		a.checks.start()
		defer a.checks.close()
	}

	pollEvery := a.pollInterval()
	poll := time.NewTicker(pollEvery)
	defer poll.Stop()
	// ringSettle gathers the ring's changes for a moment (a deploy changes
	// many reports within a second) before they are acted on.
	ringSettle := time.NewTimer(time.Hour)
	ringSettle.Stop()
	defer ringSettle.Stop()
	ringPending := false
	noticeTimer := time.NewTimer(time.Hour)
	noticeTimer.Stop()
	defer noticeTimer.Stop()
	noticePending := false
	// fetchNotice fetches what the ring announced, spaced (noticeSpacing)
	// so that a deploy that changes every report at once does not have
	// every node fetch continuously.
	fetchNotice := func() {
		if a.applied == nil || !a.git.worthFetching(a.ring) || noticePending {
			return
		}
		wait := time.Until(a.lastNoticeFetch.Add(noticeSpacing(len(a.applied.model.Nodes))))
		if wait <= 0 {
			a.lastNoticeFetch = time.Now()
			a.git.fetch()
		} else {
			noticePending = true
			noticeTimer.Reset(wait)
		}
	}
	// ackRecheck looks again, while reports received over the ring count,
	// for git's copies they no longer stand for (drainAcks.has); armed at
	// the end of any turn of the loop that finds one counting.
	ackRecheck := time.NewTimer(time.Hour)
	ackRecheck.Stop()
	defer ackRecheck.Stop()
	recheckArmed := false
	a.settle = time.NewTimer(time.Hour)
	a.settle.Stop()
	defer a.settle.Stop()
	a.drainFetch = time.NewTimer(time.Hour)
	a.drainFetch.Stop()
	defer a.drainFetch.Stop()
	reconcile := time.NewTimer(0)
	defer reconcile.Stop()
	imageGC := time.NewTicker(imageGCEvery)
	defer imageGC.Stop()
	a.git.fetch()
	a.health.lastPass.Store(time.Now().UnixNano())
	for {
		select {
		case <-ctx.Done():
			a.log.Info("agent stopping; instances keep running")
			a.savePeersLater(true, "") // the newest, for a restart while git is unreachable
			return nil
		case <-poll.C:
			a.git.fetch()
		case <-a.trigger:
			a.git.fetch()
		case <-a.ring.changed:
			if !ringPending {
				ringPending = true
				ringSettle.Reset(ringGather)
			}
		case <-ringSettle.C:
			// A member died, came back or announced a new report or tip:
			// plan with it now, and fetch what it announced.
			ringPending = false
			a.pass(ctx)
			reconcile.Reset(a.opts.Reconcile)
			fetchNotice()
			if d := a.pollInterval(); d != pollEvery {
				pollEvery = d
				poll.Reset(d)
			}
		case <-noticeTimer.C:
			noticePending = false
			a.lastNoticeFetch = time.Now()
			a.git.fetch()
		case res := <-a.git.fetched:
			if a.onFetch(res) {
				a.pass(ctx)
				reconcile.Reset(a.opts.Reconcile)
			}
			if d := a.pollInterval(); d != pollEvery {
				pollEvery = d
				poll.Reset(d)
			}
		case <-reconcile.C:
			a.pass(ctx)
			reconcile.Reset(a.opts.Reconcile)
		case <-a.rec.Wake():
			// An instance operation ended: record it and report it now.
			a.pass(ctx)
			reconcile.Reset(a.opts.Reconcile)
		case <-a.acks.arrived:
			// A node a drain waits for sent its report over the ring.
			a.pass(ctx)
			reconcile.Reset(a.opts.Reconcile)
		case <-ackRecheck.C:
			recheckArmed = false
			fetchNotice()
		case <-a.prober.Changes():
			// An instance turned ready or unready, or failed its liveness
			// check: report it (traffic follows), restart it.
			a.pass(ctx)
			reconcile.Reset(a.opts.Reconcile)
		case <-a.settle.C:
			a.publish(ctx, a.opts.Now())
		case <-a.drainFetch.C:
			// A fetch that finds no acknowledgement starts no pass: look
			// again after the same time, as long as the drain lasts.
			if !a.draining {
				a.drainPending = false
				break
			}
			a.git.fetch()
			a.drainFetch.Reset(drainFetchEvery(a.pollInterval()))
		case <-certChanged:
			// A certificate obtained here: say so at once.
			a.publish(ctx, a.opts.Now())
		case <-imageGC.C:
			a.rec.CollectImages(nil)
		case req := <-a.requests:
			req.handle(ctx, a)
		}
		if !recheckArmed && a.acks.holding() {
			// A report came over the ring (news or not: an answer to a
			// repeated ask renews it): look again while it counts.
			recheckArmed = true
			ackRecheck.Reset(ackRecheckEvery)
		}
	}
}

// onFetch takes in what a fetch found, and reports whether anything moved.
func (a *Agent) onFetch(res fetchResult) bool {
	now := a.opts.Now()
	if res.err != nil {
		a.gitOK, a.gitErr = false, res.err.Error()
		a.metrics.SyncErrors.WithLabelValues(res.stage).Inc()
		a.log.Warn("sync failed; keeping the last plan", "stage", res.stage, "err", res.err)
		return false
	}
	a.gitOK, a.gitErr = true, ""
	// What the fetch found is dated by when it began, not by when the loop
	// took it in: a fetch that finished while this agent was stopped (or
	// starved) must not make the peers' reports look a whole stop older
	// than they were, nor the peers dead.
	seen := now
	if !res.started.IsZero() && res.started.Before(now) {
		seen = res.started
	}
	a.lastFetchOK = seen
	a.metrics.SyncDuration.Observe(res.took.Seconds())
	a.metrics.SyncLastSuccess.Set(float64(now.Unix()))
	news := false
	if res.changedReports {
		// The clock rule needs the peers' reports and when they were seen.
		a.fetchedAt = seen
		a.peers = a.peers[:0]
		for _, r := range res.reports {
			if r.Node == a.opts.Node {
				continue // this node's own report is made fresh at each pass
			}
			a.peers = append(a.peers, r)
		}
		news = a.peersNews()
		a.peerProblem = res.problems
		for _, p := range res.problems {
			a.log.Debug("report ignored", "problem", p)
		}
		a.peersDirty = true // written by the pass that plans with them
	}
	if res.certsRead && a.ing != nil {
		a.ing.takeShared(res.certs, res.certRefs, res.startedAt, res.certProblems)
		for _, p := range res.certProblems {
			a.log.Debug("shared certificate ignored", "problem", p)
		}
	}
	if !res.changedTip {
		return news || res.certsRead
	}
	a.tip = res.commit
	switch kind, reason := a.admit(res); kind {
	case "":
		if err := a.accept(res); err != nil {
			a.log.Error("cannot record the applied commit", "commit", res.commit, "err", err)
			return false
		}
		a.refused = nil
		a.metrics.CommitRefused.Reset()
		a.log.Info("applied commit", "commit", short(res.commit))
		if a.leaving() {
			a.log.Warn("this node is not in the inventory of the applied commit: decommissioning (instances stop, volumes stay)",
				"commit", short(res.commit))
		}
	default:
		a.refused = &report.Refusal{Commit: res.commit, Reason: reason}
		a.metrics.CommitRefused.Reset()
		a.metrics.CommitRefused.WithLabelValues(res.commit, kind).Set(1)
		a.log.Warn("refused commit; staying on the last good one", "commit", short(res.commit), "reason", reason,
			"lastGood", short(a.appliedCommit()))
	}
	return true
}

// peerSeen is what the last fetch found of a peer's report.
type peerSeen struct {
	time    time.Time
	content string // report.ContentDigest
}

// peersNews reports whether the peers' reports just fetched say anything
// new: a peer that appeared or went, a report whose content changed, or
// one that comes after a silence of more than a third of the TTL (its
// node may have been judged dead). A heartbeat alone is not news: the
// next pass (the reconcile interval at most) takes it in. Were it news,
// every heartbeat would start a pass on every peer, and (without a ring,
// every pass pushes the node's report) each push would call for the next,
// without end.
func (a *Agent) peersNews() bool {
	ttl := time.Duration(cmp.Or(a.cluster.LivenessTTL, render.DefaultLivenessTTL))
	news := len(a.peers) != len(a.peerSeen)
	seen := make(map[string]peerSeen, len(a.peers))
	for i := range a.peers {
		r := &a.peers[i]
		prev, ok := a.peerSeen[r.Node]
		switch {
		case ok && prev.time.Equal(r.Time):
			seen[r.Node] = prev
			continue
		case !ok, r.Time.Sub(prev.time) > ttl/3:
			news = true
		}
		ps := peerSeen{time: r.Time, content: report.ContentDigest(*r)}
		news = news || ps.content != prev.content
		seen[r.Node] = ps
	}
	a.peerSeen = seen
	return news
}

// admit says why a new commit must not be applied, or "" when it may.
// Trust checks (signatures, no rewinds) plug in here.
func (a *Agent) admit(res fetchResult) (kind, reason string) {
	if res.trustErr != nil {
		return RefusedUntrusted, res.trustErr.Error()
	}
	if res.renderErr != nil {
		var ie *render.InvalidError
		if errors.As(res.renderErr, &ie) {
			first := ie.Diagnostics[0].String()
			if len(ie.Diagnostics) > 1 {
				return RefusedInvalid, fmt.Sprintf("invalid specs (%d errors), first: %s", len(ie.Diagnostics), first)
			}
			return RefusedInvalid, "invalid specs: " + first
		}
		return RefusedUnreadable, "cannot read the commit: " + res.renderErr.Error()
	}
	m := res.model
	if len(m.Instances) == 0 && !m.Cluster.AllowEmpty {
		return RefusedEmpty, "the commit renders no workload at all (set spec.allowEmpty: true in cluster.yaml to allow that)"
	}
	if v := m.Cluster.MinAgentVersion; v != "" && versionLess(a.opts.Version, v) {
		return RefusedAgentVersion, fmt.Sprintf("minAgentVersion is %s and this agent is %s: upgrade keel on this node", v, a.opts.Version)
	}
	// A commit whose inventory no longer lists this node is applied: it is
	// this node's decommission (see leaving).
	return "", ""
}

// Kinds of refusal: the reason label of keel_commit_refused_info, a fixed
// set (the reason itself, which quotes the commit, is in the report and
// the logs).
const (
	RefusedUntrusted    = "untrusted"     // signature or rewind
	RefusedInvalid      = "invalid"       // the specs do not render
	RefusedUnreadable   = "unreadable"    // the commit cannot be read
	RefusedEmpty        = "empty"         // no workload, allowEmpty false
	RefusedAgentVersion = "agent_version" // minAgentVersion is newer
)

// RefusedKinds lists every kind of refusal.
var RefusedKinds = []string{RefusedUntrusted, RefusedInvalid, RefusedUnreadable, RefusedEmpty, RefusedAgentVersion}

// leaving reports whether the applied commit's inventory no longer lists
// this node: the node is decommissioned. It stops everything it holds
// (stateless instances once their replacements run elsewhere, stateful ones
// at once; volumes stay), drops its VIPs, routes and proxies, and says so in
// its report, rather than keep serving a stale plan.
func (a *Agent) leaving() bool {
	return a.applied != nil && a.applied.model.Node(a.opts.Node) == nil
}

// accept makes the fetched commit the last good one, durably: its
// snapshot (the files it was rendered from, nothing else) is written, and
// last-good names it. Only accepted commits are snapshotted, and only the
// applied and the previous ones are kept, so refused pushes never grow the
// state directory.
func (a *Agent) accept(res fetchResult) error {
	if err := os.MkdirAll(a.specsDir(), 0o700); err != nil {
		return err
	}
	if err := sync.WriteSnapshot(filepath.Join(a.specsDir(), res.commit), res.commit, res.files); err != nil {
		return err
	}
	if err := nodeexec.WriteFileAtomic(filepath.Join(a.opts.StateDir, "last-good"), []byte(res.commit+"\n"), 0o600); err != nil {
		return err
	}
	prev := a.appliedCommit()
	before := 0
	if a.applied != nil {
		before = len(a.applied.model.Instances)
	}
	a.applied = &appliedCommit{commit: res.commit, model: res.model}
	if shrunk(before, len(res.model.Instances)) {
		// The old model and its plan are garbage now: hand their memory
		// back to the system rather than keep it in the heap's reserve.
		a.plan = nil
		defer debug.FreeOSMemory()
	}
	a.cluster = res.model.Cluster
	a.setReportKeys(res.model)
	a.ring.apply(res.model, a.leaving())
	a.storeReportPrefix()
	a.metrics.Commit.Reset()
	a.metrics.Commit.WithLabelValues(res.commit).Set(1)
	// Keep the snapshots of the applied and the previous commits only
	// (the loop writes them all, so none is being written now).
	entries, _ := os.ReadDir(a.specsDir())
	for _, e := range entries {
		if n := e.Name(); n != res.commit && n != prev {
			os.RemoveAll(filepath.Join(a.specsDir(), n))
		}
	}
	return nil
}

// shrunk reports whether a model of after instances is much smaller than
// one of before (by 4 times and by more than 1,000 instances).
func shrunk(before, after int) bool {
	return before > 1000 && before-after > 1000 && after*4 < before
}

func (a *Agent) appliedCommit() string {
	if a.applied == nil {
		return ""
	}
	return a.applied.commit
}

// reportTime is max(local clock, the peer clock at the last fetch + time
// elapsed since), so that a node with a slow clock still looks alive. The
// peer clock (planner.PeerClock) follows only the reports the planner
// accepts, never more than planner.MaxClockLead ahead of the local clock
// at that fetch, and it is recomputed from the peers' reports as they are
// now, so a report that led stops counting as soon as it goes.
func (a *Agent) reportTime(now time.Time) time.Time {
	t := now
	if a.applied != nil && !a.fetchedAt.IsZero() {
		peer := planner.PeerClock(a.applied.model, a.peers, a.fetchedAt)
		if elapsed := now.Sub(a.fetchedAt); elapsed > 0 {
			peer = peer.Add(elapsed)
		}
		// A fetch dated ahead of now (the local clock stepped back) must
		// not carry its lead past the bound either.
		if limit := now.Add(planner.MaxClockLead(a.applied.model)); peer.After(limit) {
			peer = limit
		}
		if peer.After(t) {
			t = peer
		}
	}
	return t.UTC().Truncate(time.Millisecond)
}

// pass plans with the freshest knowledge and reconciles.
func (a *Agent) pass(ctx context.Context) {
	a.health.lastPass.Store(time.Now().UnixNano())
	defer func(start time.Time) { a.log.Debug("pass", "took", time.Since(start)) }(time.Now())
	defer a.updateForge()
	if a.applied == nil {
		// Nothing applied yet: nothing to run, but a refusal is news.
		if a.refused != nil && a.gitOK {
			a.publish(ctx, a.opts.Now())
		}
		return
	}
	defer a.health.ready.Store(true)
	// What the instance operations that ended did goes into the report the
	// plan is made with: a rollout releases the next replica as soon as
	// the previous one runs.
	a.rec.Collect()
	now := a.opts.Now()
	warming := a.syncChecks(now)
	// This node knows how the others fare as of its last successful fetch:
	// it judges them at that time, so that nobody looks dead for lack of
	// news, whether git is unreachable or a fetch is merely slow (a large
	// commit takes tens of seconds). While git is unreachable it keeps the
	// plan of its last successful fetch and only restarts what crashed.
	// (Its published report is dated now: the publisher keeps it fresh.)
	planAt := now
	switch {
	case !a.lastFetchOK.IsZero() && a.lastFetchOK.Before(now):
		planAt = a.lastFetchOK
	case !a.gitOK && !a.fetchedAt.IsZero():
		planAt = a.fetchedAt // restarted while git is unreachable
	}
	m := a.applied.model
	ringOn := a.ring.on()
	peers := slices.Clone(a.peers)
	a.ackLimit = time.Time{}
	if ringOn {
		// Reports over the ring count up to the clock lead past the last
		// fetch: while git is unreachable the plan stays that of the last
		// fetch (a newer report would move its clock past the others').
		a.ackLimit = planAt.Add(planner.MaxClockLead(m))
		var merged bool
		if peers, merged = withAcks(peers, a.acks.acks(), a.opts.Node, a.ackLimit); merged {
			a.peersDirty = true // peers.json holds what the plan was made with
		}
	}
	a.acks.setLimit(a.ackLimit)
	own := a.ownReport(ctx, planAt)
	keepUp(&own, peers, now.Add(planner.MaxClockLead(m)))
	reports := append(peers, own)
	if m.Cluster.Gossip != nil && !a.ring.on() {
		a.ring.apply(m, a.leaving()) // a start that failed, tried again after retryStart
	}
	ring, _ := a.ring.view(a.reportTime(now).Sub(now))
	plan := planner.Compute(planner.Input{Model: m, Commit: a.applied.commit, Reports: reports, Now: planAt,
		PresumeAlive: a.warmingUp(m, planAt), Gossip: ring})
	a.plan = plan
	// Once the pass has acted (it is on the loop, but off the path from a
	// fetch to the actions and the report).
	defer a.savePeersLater(false, plan.PlacementID)
	a.noteRing(plan, ring)
	a.metrics.Plan.Reset()
	a.metrics.Plan.WithLabelValues(plan.PlanID).Set(1)
	alive, settling := 0, 0
	for _, n := range plan.Nodes {
		if n.Alive {
			alive++
		}
		if n.Settling {
			settling++
		}
	}
	a.metrics.NodesAlive.Set(float64(alive))
	a.metrics.NodesSettling.Set(float64(settling))
	a.updatePlanMetrics(m, plan)

	if m.Cluster.Suspend {
		a.log.Debug("cluster suspended: instances are watched, nothing is changed")
	}
	// The proxies and the ingress follow the plan before the instances
	// do: an instance this pass stops has left the plan's endpoints, and
	// the reconciler waits only for the other nodes (nodeexec's drain).
	leaving := a.leaving()
	netPlan := plan
	if leaving {
		netPlan = &planner.Plan{} // no VIPs, routes nor proxies on a node that left
	}
	a.savePeersBefore(plan)
	a.network(ctx, m, netPlan)
	if a.ing != nil {
		a.ing.pub.setRepo(m.Cluster)
		a.ing.pass(m, netPlan, leaving)
	}
	start := time.Now()
	res, err := a.rec.Pass(ctx, nodeexec.Desired{Model: m, Plan: plan, Reports: reports, Frozen: m.Cluster.Suspend, Leaving: leaving})
	a.metrics.ReconcileDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		a.metrics.ReconcileErrors.Inc()
		a.log.Error("reconcile pass failed", "err", err)
	}
	a.metrics.ReconcileErrors.Add(float64(len(res.Errors)))
	a.metrics.InstancesWaiting.Set(float64(len(res.Waiting)))
	a.metrics.InstancesDraining.Set(float64(len(res.Draining)))
	// The other nodes' acknowledgements come in their reports. With a
	// ring, the nodes a drain or a rollout step of this node waits for
	// are asked for them over it (drainAcks). Without one, look for them
	// in git sooner than the next poll (with only polls to learn of
	// pushes, each step of a rollout would wait for two).
	var waits []string
	if ringOn {
		waits = append(res.DrainWaits, rolloutWaits(plan, a.opts.Node)...)
	}
	a.acks.ask(waits)
	a.draining = len(res.Draining) > 0 && !ringOn
	if a.draining && !a.drainPending && a.drainFetch != nil {
		a.drainPending = true
		a.drainFetch.Reset(drainFetchEvery(a.pollInterval()))
	}
	a.metrics.InstanceOperations.Set(float64(res.InFlight))
	a.inFlight = res.InFlight + warming
	if w := waitingText(res.Waiting); w != a.waiting {
		a.waiting = w
		if w != "" {
			a.log.Info("stateful instances wait for another node to stop them (break before make)", "waiting", w)
		}
	}
	if res.Created+res.Restarted+res.Replaced+res.Stopped+res.Removed > 0 {
		a.log.Info("reconciled", "created", res.Created, "restarted", res.Restarted, "replaced", res.Replaced,
			"stopped", res.Stopped, "removed", res.Removed, "errors", len(res.Errors), "plan", short(plan.PlanID))
	}
	a.updateInstanceMetrics(m)
	a.publish(ctx, now)
}

// withAcks returns the peers' reports read from git with, for each node,
// the report it sent over the gossip ring (drainAcks) instead when that
// one is newer and dated no later than limit: a rollout step or a drain
// then goes on as soon as the node that it waits for changed, rather than
// once its push and this node's fetch are through. merged says whether
// one was taken. Each node pushes its newest report to git as well.
func withAcks(peers, acks []report.Report, self string, limit time.Time) (_ []report.Report, merged bool) {
	for i := range acks {
		ack := &acks[i]
		if ack.Node == self || ack.Time.After(limit) {
			continue
		}
		j := slices.IndexFunc(peers, func(r report.Report) bool { return r.Node == ack.Node })
		switch {
		case j < 0:
			peers, merged = append(peers, *ack), true
		case planner.Newer(ack, &peers[j]):
			peers[j], merged = *ack, true
		}
	}
	return peers, merged
}

// rolloutWaits returns the nodes of the replicas that a rollout of a
// Service with a replica on node waits for (planner.Rollout.Waiting),
// other than node: their next reports release the next replicas. Only the
// nodes that run a replica ask, so that a step costs messages in
// proportion to the Service's replicas, not to the cluster's nodes; the
// others learn of it through git (and a drain waits for their proxies).
func rolloutWaits(plan *planner.Plan, node string) []string {
	var nodes []string
	for _, svc := range plan.Services {
		ro := svc.Rollout
		if ro == nil || len(ro.Waiting) == 0 {
			continue
		}
		member := slices.ContainsFunc(plan.Placements, func(pl planner.Placement) bool {
			return pl.Node == node && pl.Service == svc.Name
		})
		if !member {
			continue
		}
		for _, pl := range plan.Placements {
			if slices.Contains(ro.Waiting, pl.Instance) && pl.Node != node && pl.Node != "" && !slices.Contains(nodes, pl.Node) {
				nodes = append(nodes, pl.Node)
			}
		}
	}
	return nodes
}

// keepUp dates this node's own report, for its own plan, no earlier than
// the newest of the peers' reports (up to limit: now plus the clock lead
// allowed): a node is alive in its own plan. Its report is dated at planAt,
// the start of the last successful fetch, but a slow fetch (a busy machine)
// brings reports pushed while it ran, and the newest report is what every
// node is judged against: dated more than the TTL before it, this node
// would judge itself dead, and hand its own instances to a node it had
// taken them from (a move back). Since moves with Time, so that the node
// does not look settled sooner than its peers see it.
func keepUp(own *report.Report, peers []report.Report, limit time.Time) {
	newest := own.Time
	for i := range peers {
		if t := peers[i].Time; t.After(newest) && !t.After(limit) {
			newest = t
		}
	}
	if d := newest.Sub(own.Time); d > 0 {
		own.Time = newest
		if !own.Since.IsZero() {
			own.Since = own.Since.Add(d)
		}
	}
}

// waitingText describes the instances a pass waited for, in name order.
func waitingText(w map[string]error) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(w)) {
		parts = append(parts, name+": "+w[name].Error())
	}
	return strings.Join(parts, "; ")
}

// warmingUp returns, during the first livenessTTL after the agent starts
// (judged at now, the time the plan is made for: the last fetch),
// the inventory nodes that have not reported at all: they are presumed
// alive so that an agent starting with (or before) its peers does not take
// their work for the moment it takes them to report.
func (a *Agent) warmingUp(m *render.Model, now time.Time) []string {
	if a.started.IsZero() || now.Sub(a.started) > time.Duration(m.Cluster.LivenessTTL) {
		return nil
	}
	reported := map[string]bool{a.opts.Node: true}
	for _, r := range a.peers {
		reported[r.Node] = true
	}
	var out []string
	for _, n := range m.Nodes {
		if !reported[n.Name] {
			out = append(out, n.Name)
		}
	}
	return out
}

// network points the proxies, VIPs and routes at the plan.
func (a *Agent) network(ctx context.Context, m *render.Model, plan *planner.Plan) {
	var services []proxy.Service
	var vips []netip.Addr
	for _, s := range plan.Services {
		ps := proxy.Service{Name: s.Name, VIP: s.VIP, Port: s.Port}
		for _, ep := range s.Endpoints {
			ps.Endpoints = append(ps.Endpoints, netip.AddrPortFrom(ep.Address, uint16(s.Port)))
		}
		services = append(services, ps)
		vips = append(vips, s.VIP)
	}
	opCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := a.opts.Driver.SetVIPs(opCtx, vips); err != nil {
		a.log.Warn("service addresses", "err", err)
	}
	var routes []nodeexec.Route
	for _, r := range plan.RoutesFor(a.opts.Node) {
		routes = append(routes, nodeexec.Route{Dest: r.Dest, Via: r.Via})
	}
	if err := a.opts.Driver.SetRoutes(opCtx, routes); err != nil {
		a.log.Warn("routes", "err", err)
	}
	if err := a.proxies.Set(services); err != nil {
		a.log.Warn("service proxies", "err", err)
	} else {
		a.proxied = services
	}
	if r, ok := a.opts.Driver.(nodeexec.Redirector); ok && a.ing != nil {
		err := r.SetRedirects(opCtx, a.ing.redirects(m.Node(a.opts.Node)))
		if msg := fmt.Sprint(err); err != nil && msg != a.ing.redirectErr {
			a.log.Warn("ingress redirects of ports 80 and 443", "err", err)
		}
		a.ing.redirectErr = fmt.Sprint(err)
	}
}

// ownReport builds this node's report from what it holds now.
func (a *Agent) ownReport(ctx context.Context, now time.Time) report.Report {
	r := report.Report{
		Node: a.opts.Node, Time: a.reportTime(now), Clock: now.UTC().Truncate(time.Millisecond), AgentVersion: a.opts.Version,
		Commit: a.appliedCommit(), Refused: a.refused, Decommissioned: a.leaving(),
		Problems: a.checks.current(),
	}
	if a.plan != nil {
		r.PlanID = a.plan.PlanID
	}
	// Since as the peers see it: this node judges itself settling
	// (planner.SettlePeriod) by the run of its reports pushed so far, not
	// by its own clock, so that no two nodes each hold the other settling
	// and both take a moved instance. (The publisher sets the Since of the
	// reports it pushes.)
	if a.pub != nil {
		ttl := time.Duration(cmp.Or(a.cluster.LivenessTTL, render.DefaultLivenessTTL))
		r.Since = r.Time.Add(-a.pub.settledFor(r.Time, ttl))
	}
	if c, err := a.opts.Driver.Capacity(ctx); err == nil {
		r.Capacity = report.Capacity{CPU: c.CPU, Memory: c.Memory}
	}
	instances, volumes, err := a.rec.Status(ctx)
	if err != nil {
		a.log.Warn("listing volumes", "err", err)
	}
	a.checked(instances)
	r.Instances, r.Volumes = instances, volumes
	if a.ing != nil {
		r.Certificates = a.ing.report()
	}
	for _, s := range a.proxied {
		rs := report.Service{Name: s.Name, VIP: s.VIP.String(), Endpoints: []string{}}
		for _, ep := range s.Endpoints {
			rs.Endpoints = append(rs.Endpoints, ep.String())
		}
		r.Services = append(r.Services, rs)
	}
	return r
}

// opSettle is how long a report that changed while instance operations
// are in flight waits for them before it is published anyway.
const opSettle = time.Second

// With a gossip ring, a changed report is pushed once it has not changed
// for ringQuiet, or ringPushMax after the first change not pushed: the
// nodes that a change concerns at once (a drain, a rollout step) get it
// over the ring, and each push makes every peer fetch, so a rollout's
// burst of changes reaches git in one or two pushes rather than one per
// change, on a git server and CPUs the rollout itself competes for.
const (
	ringQuiet   = 500 * time.Millisecond
	ringPushMax = 2 * time.Second
)

// ringHeld is a changed report held back with a ring: its content, when
// it last changed and when the first change not pushed came (real time,
// as the timers').
type ringHeld struct {
	content        string
	changed, since time.Time
}

// publish hands the report to the publisher when its content changed or
// the report interval passed; the push never blocks the loop.
//
// A change made while instance operations are in flight (instances
// starting, a new commit whose work is under way) waits up to opSettle
// for them to end: most end sooner, and the report that says how they
// ended is then the only push, rather than one push (and a fetch on every
// peer) for the work begun and another for the work done. Operations that
// last longer (a jail creation) are published as under way after opSettle.
func (a *Agent) publish(ctx context.Context, now time.Time) {
	r := a.ownReport(ctx, now)
	if a.plan != nil {
		r.PlanID = a.plan.PlanID
	}
	// The content leaves out the report's times (report.ContentDigest):
	// with a ring, a push is news, and heartbeats go every interval.
	// Without one every pass pushes: the report-age rule relies on each
	// node's run being current at its peers (pushed only every
	// reportInterval, a node starved around the TTL had one instance
	// started twice for one death: e2e TestStarvedAgentMovesNothingBack).
	// But a pass whose report says nothing new pushes only once
	// heartbeatGap has passed since the last push: during a rollout a
	// peer's news starts passes in bursts, and each push of an unchanged
	// report only makes every peer fetch, on the same CPUs and git server
	// the rollout's own pushes and fetches wait for.
	content := report.ContentDigest(r)
	ttl := time.Duration(cmp.Or(a.cluster.LivenessTTL, render.DefaultLivenessTTL))
	if a.ring.on() {
		// The newest report, pushed or not, for the nodes that asked.
		ack := r
		ack.Since = a.pub.runSince(r.Time, ttl)
		a.acks.offer(ack, content)
	}
	interval := a.heartbeatInterval()
	due := now.Sub(a.lastPublish.at) >= interval
	if content == a.lastPublish.content && !due && (a.ring.on() || now.Sub(a.lastPublish.at) < heartbeatGap(interval)) {
		a.heldSince = time.Time{}
		return
	}
	if a.inFlight > 0 && (!due || a.lastPublish.at.IsZero()) {
		// Real time, as the timer's, whatever the injected clock.
		if a.heldSince.IsZero() {
			a.heldSince = time.Now()
		}
		if wait := time.Until(a.heldSince.Add(opSettle)); wait > 0 {
			a.settle.Reset(wait)
			return
		}
	}
	if a.ring.on() && !due {
		// With a ring, the nodes that wait for this report have it
		// already (drainAcks): git gets a burst of changes together, once
		// the report has been quiet for ringQuiet, or ringPushMax after
		// the first change it holds.
		t := time.Now()
		if content != a.ringHeld.content {
			a.ringHeld.content, a.ringHeld.changed = content, t
			if a.ringHeld.since.IsZero() {
				a.ringHeld.since = t
			}
		}
		if wait := min(a.ringHeld.changed.Add(ringQuiet).Sub(t), a.ringHeld.since.Add(ringPushMax).Sub(t)); wait > 0 {
			a.settle.Reset(wait)
			return
		}
	}
	a.heldSince, a.ringHeld = time.Time{}, ringHeld{}
	a.settle.Stop()
	a.lastPublish.content, a.lastPublish.at = content, now
	prefix := a.cluster.ReportRefPrefix
	if prefix == "" {
		prefix = render.DefaultReportRefPrefix
	}
	a.pub.publish(publication{report: r, builtAt: now, prefix: prefix, reportRepo: a.cluster.ReportRepo, interval: interval, ttl: ttl})
}

// drainFetchEvery is how soon the agent fetches again while an instance
// of its waits for the other nodes' proxies to drop it: a quarter of the
// poll interval, between 200 ms and 2 s (with the default 10 s poll, at
// most five fetches in a drain's 10 s bound).
func drainFetchEvery(poll time.Duration) time.Duration {
	return min(max(poll/4, 200*time.Millisecond), 2*time.Second)
}

// heartbeatGap is, without a ring, the least time between two pushes of
// an unchanged report: a quarter of the report interval, at most a
// second (the reconcile interval's order, at which passes pushed before).
func heartbeatGap(interval time.Duration) time.Duration {
	return min(interval/4, time.Second)
}

// noticeSpacing is the least time between two fetches the ring's news
// starts on a cluster of n nodes: 30 ms a node, at most 30 s. A quiet
// cluster fetches on the first notice at once; in a burst (a deploy that
// changes every report) each node fetches once a spacing, so the git server
// sees about one fetch every 30 ms, whatever the cluster's size (the
// poll's own fetches aside).
func noticeSpacing(n int) time.Duration {
	return min(time.Duration(n)*30*time.Millisecond, 30*time.Second)
}

// ringGather is how long the loop gathers the ring's changes before it
// plans and fetches with them.
const ringGather = 200 * time.Millisecond

// pollInterval is the interval between two fetches: Options.Poll, or,
// in a gossip ring, safetyPoll: the ring says when a peer's report or the
// spec tip changed, and the poll is only the safety net (and brings the
// reports of the nodes the ring does not vouch for).
//
// A node that sees no majority of the ring alive (it may be the one cut
// off) polls at Options.Poll: it judges the others by their reports. So
// does, at a third of livenessTTL at most, a node whose last plan holds a
// node alive that its ring does not (cut off from the ring, never seen in
// it, or gone from it on purpose): only the poll brings that node's
// reports, and a safety poll longer than the TTL (300 ms a node: 5 min on
// 1,000 nodes, against a TTL of 3) would let it die and come back at every
// poll, its work moving each time.
func (a *Agent) pollInterval() time.Duration {
	if a.cluster.Gossip != nil && a.ring.on() && !a.ringMinority && a.applied != nil {
		d := safetyPoll(a.opts.Poll, a.cluster, len(a.applied.model.Nodes))
		if a.aliveByReports {
			ttl := time.Duration(cmp.Or(a.cluster.LivenessTTL, render.DefaultGossipLivenessTTL))
			d = min(d, max(a.opts.Poll, ttl/3))
		}
		return d
	}
	return a.opts.Poll
}

// noteRing records, once a pass, what its plan says of the ring g (nil
// without one): whether this node saw no majority of it
// (planner.WarnGossipMinority), and whether the plan holds a node alive
// that the ring does not (its reports alone keep it alive). The poll and
// the heartbeat follow them.
func (a *Agent) noteRing(plan *planner.Plan, g *planner.Gossip) {
	a.ringMinority, a.aliveByReports = false, false
	if g == nil {
		return
	}
	a.ringMinority = hasWarning(plan, planner.WarnGossipMinority)
	a.aliveByReports = slices.ContainsFunc(plan.Nodes, func(n planner.Node) bool {
		return n.Alive && n.Name != a.opts.Node && !g.Members[n.Name].Alive
	})
}

// safetyPoll is the poll of a node in a gossip ring of n nodes: the
// longest of poll, the report interval and 300 ms a node. The cluster as
// a whole then lists the remote's refs about three times a second at
// most, whatever its size (at 1,000 nodes the advertisement of their
// refs is most of the git server's work), and the first node to see a new
// tip announces it to the others.
func safetyPoll(poll time.Duration, c render.Cluster, n int) time.Duration {
	return max(poll, time.Duration(c.ReportInterval), time.Duration(n)*300*time.Millisecond)
}

// heartbeatInterval is the interval between two pushes of an unchanged
// report: the short one (see heartbeat) while this node sees no majority
// of its ring, or while a node its ring does not see is alive by its
// reports alone: such a node (an agent that refused the commit that turned
// gossip on, or runs a version without gossip) may judge this one by its
// reports at a TTL of 30 s, and would hold it dead between two heartbeats
// of a minute, and take its work.
func (a *Agent) heartbeatInterval() time.Duration {
	return heartbeat(a.cluster, a.ring.on() && (a.ringMinority || a.aliveByReports))
}

func hasWarning(p *planner.Plan, code string) bool {
	return slices.ContainsFunc(p.Warnings, func(w planner.Warning) bool { return w.Code == code })
}

// loopStallLimit is how long the loop may go without a pass before
// /healthz fails, and before the publisher stops refreshing this node's
// report: a stuck agent stops looking alive. A pass never waits for an
// instance operation (a stop's grace included), only for the driver's
// listing of what runs and the network calls, each bounded by a minute.
func (a *Agent) loopStallLimit() time.Duration {
	return 3*a.opts.Reconcile + time.Minute
}

// updatePlanMetrics sets what the plan says of the whole cluster: the
// instances that cannot be placed (logged when that set changes) and each
// Service's replicas and endpoints.
func (a *Agent) updatePlanMetrics(m *render.Model, plan *planner.Plan) {
	a.metrics.Unschedulable.Set(float64(len(plan.Unschedulable)))
	var parts []string
	for _, u := range plan.Unschedulable {
		parts = append(parts, u.Instance+": "+u.Reason)
	}
	if text := strings.Join(parts, "; "); text != a.unschedulable {
		a.unschedulable = text
		if text != "" {
			a.log.Warn("instances cannot be placed on any node", "count", len(parts), "unschedulable", text)
		}
	}
	services := make(map[string]bool, len(m.Services))
	replicas := make(map[string]int, len(m.Services))
	for _, s := range m.Services {
		services[s.Name] = true
		replicas[s.Name] = s.Replicas
		a.metrics.ServiceReplicas.WithLabelValues(s.Name).Set(float64(s.Replicas))
	}
	var below, paused []string
	for _, s := range plan.Services {
		a.metrics.ServiceEndpoints.WithLabelValues(s.Name).Set(float64(len(s.Endpoints)))
		v := 0.0
		if s.Rollout != nil && s.Rollout.Paused {
			v = 1
			paused = append(paused, fmt.Sprintf("%s (%s not ready in time)", s.Name, strings.Join(s.Rollout.Failed, ", ")))
		}
		a.metrics.RolloutPaused.WithLabelValues(s.Name).Set(v)
		if len(s.Endpoints) < replicas[s.Name] {
			below = append(below, fmt.Sprintf("%s %d/%d", s.Name, len(s.Endpoints), replicas[s.Name]))
		}
	}
	// Logged when the set changes, not at every pass: a deploy moves
	// through a few counts, a lasting shortfall is one line.
	if text := strings.Join(below, ", "); text != a.belowReplicas {
		if text != "" {
			a.log.Warn("services below their replica count (ready/replicas)", "services", text)
		} else if a.belowReplicas != "" {
			a.log.Info("every service has its replicas ready")
		}
		a.belowReplicas = text
	}
	if text := strings.Join(paused, ", "); text != a.paused {
		if text != "" {
			a.log.Warn("rollouts paused: fix the spec or git revert", "services", text)
		} else if a.paused != "" {
			a.log.Info("no rollout is paused")
		}
		a.paused = text
	}
	for name := range a.servicesSeen {
		if !services[name] {
			a.metrics.ServiceReplicas.DeleteLabelValues(name)
			a.metrics.ServiceEndpoints.DeleteLabelValues(name)
			a.metrics.RolloutPaused.DeleteLabelValues(name)
		}
	}
	a.servicesSeen = services
}

func (a *Agent) updateInstanceMetrics(m *render.Model) {
	a.metrics.Instances.Reset()
	a.metrics.InstanceInfo.Reset()
	for _, s := range report.States {
		a.metrics.Instances.WithLabelValues(string(s)).Set(0)
	}
	held := a.rec.Instances()
	for name, st := range held {
		a.metrics.Instances.WithLabelValues(string(st.State)).Inc()
		a.metrics.InstanceInfo.WithLabelValues(name, st.Service, string(st.State)).Set(1)
		if d := st.Restarts - a.restarted[name]; d > 0 {
			a.metrics.InstanceRestarts.WithLabelValues(name).Add(float64(d))
		}
		a.restarted[name] = st.Restarts
	}
	a.pruneInstanceMetrics(func(name string) bool { _, ok := held[name]; return ok })
}

// pruneInstanceMetrics deletes the per-instance series (and the restart
// counts behind them) of the instances this node no longer holds: a model
// that shrinks gives its memory back.
func (a *Agent) pruneInstanceMetrics(holds func(string) bool) {
	for name := range a.restarted {
		if !holds(name) {
			a.metrics.InstanceRestarts.DeleteLabelValues(name)
			delete(a.restarted, name)
		}
	}
	if len(a.restarted) == 0 {
		a.restarted = map[string]int{} // a map never shrinks its buckets
	}
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// versionLess compares dotted versions numerically ("0.10.0" > "0.9.1");
// a development build ("0.1.0-dev") counts as its release.
func versionLess(have, want string) bool {
	parse := func(v string) []int {
		v = strings.TrimPrefix(v, "v")
		v, _, _ = strings.Cut(v, "-")
		var out []int
		for p := range strings.SplitSeq(v, ".") {
			n := 0
			for _, c := range p {
				if c < '0' || c > '9' {
					break
				}
				n = n*10 + int(c-'0')
			}
			out = append(out, n)
		}
		return out
	}
	h, w := parse(have), parse(want)
	for i := range max(len(h), len(w)) {
		var x, y int
		if i < len(h) {
			x = h[i]
		}
		if i < len(w) {
			y = w[i]
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// peersFile keeps the peers' reports of the last successful fetch, so that
// an agent restarted while git is unreachable carries on with the plan it
// had rather than believing itself alone.
const peersFile = "peers.json"

type savedPeers struct {
	FetchedAt time.Time       `json:"fetchedAt"`
	Reports   []report.Report `json:"reports"`
}

// peersSaveGap is the least time between two writes of the peers' reports
// to the state directory while the placements stay the same: the copy
// serves only an agent restarted while git is unreachable, and a write
// (two fsyncs) before each step of a rollout on every node slowed every
// step. A pass whose placements changed writes them before it acts
// (savePeersBefore).
const peersSaveGap = time.Second

// savePeersBefore writes the peers' reports before a pass acts on plan
// when they changed and the plan's placements (planner.PlacementID:
// the commit, each instance's node and address, the ingress owners)
// differ from those of the plan made from the reports written last. The
// pass may act on the move (stop a stateful instance that moved, say): an
// agent killed then and restarted while git is unreachable must plan from
// these reports, not from older ones that would give the instance back to
// it. A plan that moves nothing (a rollout's next release, a replica
// turned ready) is written after the pass, at most once a second: the
// saved reports place every instance where this pass does.
func (a *Agent) savePeersBefore(plan *planner.Plan) {
	if a.peersDirty && plan.PlacementID != a.peersSavedPlaces {
		a.savePeersLater(true, plan.PlacementID)
	}
}

// savePeersLater writes the peers' reports when they changed since the
// last write and that was peersSaveGap ago (at once with now); places is
// the PlacementID of the plan made from them. Each pass calls it again,
// so the last change is written within a reconcile interval.
func (a *Agent) savePeersLater(now bool, places string) {
	if !a.peersDirty || !now && time.Since(a.peersSavedAt) < peersSaveGap {
		return
	}
	if err := a.savePeers(); err != nil {
		a.log.Warn("saving the peers' reports", "err", err)
		return
	}
	a.peersDirty, a.peersSavedAt, a.peersSavedPlaces = false, time.Now(), places
}

func (a *Agent) savePeers() error {
	reports := a.peers
	if !a.ackLimit.IsZero() {
		// The reports the plans were made with: a restart while git is
		// unreachable plans as the node did before it.
		reports, _ = withAcks(slices.Clone(a.peers), a.acks.acks(), a.opts.Node, a.ackLimit)
	}
	data, err := json.Marshal(savedPeers{FetchedAt: a.fetchedAt, Reports: reports})
	if err != nil {
		return err
	}
	return nodeexec.WriteFileAtomic(filepath.Join(a.opts.StateDir, peersFile), data, 0o600)
}

func (a *Agent) loadPeers() error {
	data, err := os.ReadFile(filepath.Join(a.opts.StateDir, peersFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var sp savedPeers
	if err := json.Unmarshal(data, &sp); err != nil {
		return err
	}
	a.peers, a.fetchedAt = sp.Reports, sp.FetchedAt
	return nil
}

// setReportKeys takes the report keys of the applied commit's inventory:
// reports of those nodes count only when signed.
func (a *Agent) setReportKeys(m *render.Model) {
	keys, err := sync.ReportKeysOf(m)
	if err != nil {
		a.log.Warn("report keys", "err", err)
	}
	a.reportKeys = keys
	a.acks.setKeys(keys, m)
	if n := m.Node(a.opts.Node); n != nil && n.ReportKey != "" && a.opts.ReportSigner == nil {
		a.log.Warn("this node has a reportKey but the agent has no --report-key: the other nodes will ignore its reports")
	}
}
