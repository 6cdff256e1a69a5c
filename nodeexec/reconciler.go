package nodeexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Restart backoff: the first restart after a crash waits minBackoff, each
// further one twice as long up to maxBackoff; an instance that stayed up
// resetAfter starts again from minBackoff.
const (
	minBackoff = time.Second
	maxBackoff = 5 * time.Minute
	resetAfter = time.Minute
)

// DefaultMaxParallel is how many instance operations run at once when
// Config.MaxParallel is zero.
const DefaultMaxParallel = 4

// DefaultDrainTimeout is how long, at most, the stop of an instance that
// serves a Service waits for the other alive nodes' reports to show that
// their proxies no longer send it connections, when Config.DrainTimeout
// is zero.
const DefaultDrainTimeout = 10 * time.Second

// Config configures a Reconciler.
type Config struct {
	Node     string
	Driver   Driver
	StateDir string
	Logger   *slog.Logger
	// Now is the clock; time.Now when nil. Only the owner's goroutine
	// (see Reconciler) reads it.
	Now func() time.Time
	// StopGrace is how long an instance has to stop before it is killed.
	StopGrace time.Duration
	// OpTimeout bounds each driver call.
	OpTimeout time.Duration
	// MaxParallel bounds the instance operations in flight on the node
	// (DefaultMaxParallel when zero); one instance never has more than one.
	MaxParallel int
	// DrainTimeout bounds the wait for a serving instance's drain
	// (DefaultDrainTimeout when zero).
	DrainTimeout time.Duration
	// Puller fetches the OCI images instances start from, into its
	// cache, for the driver (an ImageStore) to unpack; nil: an instance
	// whose spec.image is an OCI image cannot start (its report says
	// why). MaxPulls bounds the pulls at once (DefaultMaxPulls when 0).
	Puller   *oci.Puller
	MaxPulls int
	// ImageGC bounds the images kept (CollectImages).
	ImageGC ImageGC
}

// Desired is this node's view of what should run: the model of the last
// good commit, the plan, and the reports of the other nodes (which tell when
// a moved instance runs on its new node).
type Desired struct {
	Model   *render.Model
	Plan    *planner.Plan
	Reports []report.Report
	// Frozen (the cluster's suspend) keeps the node as it is: exits are
	// still observed and recorded, and operations already in flight
	// finish, but nothing is started, stopped or changed.
	Frozen bool
	// Leaving (the node is no longer in the inventory) releases every
	// instance, including those that can be placed nowhere else: a node
	// leaving the cluster never keeps anything running.
	Leaving bool
}

// Result sums up a pass. The counts and Errors are those of the operations
// that finished since the previous pass (a pass only starts operations; the
// next one that runs after an operation ended counts what it did).
type Result struct {
	Created, Restarted, Replaced, Stopped, Removed int
	// Errors are per-instance problems; one broken instance never stops
	// the others.
	Errors map[string]error
	// Waiting are the instances placed here that wait for another node
	// (ErrWaiting), with what they wait for.
	Waiting map[string]error
	// Draining are the instances whose stop waits for the other nodes'
	// proxies to stop sending them connections (see Reconciler.drained).
	Draining []string
	// DrainWaits are the nodes the drains wait for: their newest reports
	// still show their proxies sending connections to a draining instance.
	DrainWaits []string
	// InFlight is how many operations run when the pass returns.
	InFlight int
}

// Reconciler makes the node match its share of the plan.
//
// One goroutine owns it (the agent's loop): only that goroutine calls Pass,
// Status, Instances, DeleteVolume and Close, and the state is only ever read
// or written on it, so the state needs no lock. The slow work, an
// operation per instance (its volumes, start, stop, destroy, limits), runs
// on goroutines the Reconciler owns: at most one per instance, at most
// Config.MaxParallel in all. An operation calls the driver only; it never
// touches the state. When it ends it hands its outcome back (under mu) and
// signals Wake, and the next pass folds the outcome into the state and
// saves it. Close cancels the operations in flight and waits for them.
type Reconciler struct {
	cfg Config
	log *slog.Logger

	// Owned by the owner's goroutine.
	state     *State
	ops       map[string]*operation // started and not folded yet, by instance
	held      map[string]retry      // instances whose last operation failed
	drain     map[string]time.Time  // instances whose stop waits for their drain, since when
	unwell    map[string]unwell     // instances whose liveness (or startup) check failed
	pulls     map[string]*pull      // images and artifacts wanted and not yet there, by digest (artifactKey)
	images    map[string]bool       // OCI images the driver has, by digest, and artifacts cached, by artifactKey
	pulling   map[string]*operation // instances whose start waits for their image, as of the last pass
	pullWaits map[string]pullWait   // since when they wait, by instance
	wanted    map[string]bool       // OCI images and artifacts the last pass's instances need, as pulls
	gc        imageGC               // the image collection, when one runs
	folded    Result                // what was folded since the last Pass returned
	unsaved   bool                  // an outcome was folded since the state was saved
	saved     []byte                // the state as last written
	closed    bool

	ctx    context.Context // the operations'; Close cancels it
	cancel context.CancelFunc
	wg     gosync.WaitGroup // one per operation goroutine
	wake   chan struct{}    // one slot: an outcome is waiting to be folded

	mu   gosync.Mutex
	done []*operation // ended and not folded yet; at most MaxParallel
}

// NewReconciler loads the state from the state directory. Instances that
// run are found again on the first pass.
func NewReconciler(cfg Config) (*Reconciler, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = time.Minute
	}
	if cfg.MaxParallel <= 0 {
		cfg.MaxParallel = DefaultMaxParallel
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.MaxPulls <= 0 {
		cfg.MaxPulls = DefaultMaxPulls
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	st, err := LoadState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Reconciler{
		cfg: cfg, state: st, log: cfg.Logger, ops: map[string]*operation{}, held: map[string]retry{}, drain: map[string]time.Time{}, unwell: map[string]unwell{},
		pulls: map[string]*pull{}, images: map[string]bool{}, pulling: map[string]*operation{}, pullWaits: map[string]pullWait{}, wanted: map[string]bool{},
		folded: newResult(), ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1),
	}, nil
}

// ErrClosed is returned by Pass after Close.
var ErrClosed = errors.New("reconciler closed")

// op bounds one driver call.
func (r *Reconciler) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.OpTimeout)
}

// InFlight returns how many operations were started and not yet folded
// into the state.
func (r *Reconciler) InFlight() int { return len(r.ops) }

// Wake receives a value when an operation has ended: the owner should run a
// pass soon, to fold its outcome into the state and report it. Bursts
// collapse into one value.
func (r *Reconciler) Wake() <-chan struct{} { return r.wake }

func newResult() Result { return Result{Errors: map[string]error{}, Waiting: map[string]error{}} }

// Collect folds the outcomes of the operations that have ended into the
// state, so that what Status and Instances show next (the report a pass is
// planned with) includes them. Pass collects too; the next Pass saves the
// state and returns what was folded.
func (r *Reconciler) Collect() {
	r.collect(r.cfg.Now())
}

// Pass runs one reconcile pass against d: it folds the outcomes of the
// operations that ended into the state, reads what runs from the driver,
// starts the operations the node needs on free workers, saves the state and
// returns. It never waits for an operation.
func (r *Reconciler) Pass(ctx context.Context, d Desired) (Result, error) {
	if r.closed {
		return newResult(), ErrClosed
	}
	now := r.cfg.Now()
	r.collect(now)
	res := r.folded
	r.folded = newResult()
	opCtx, cancel := r.op(ctx)
	running, err := r.cfg.Driver.Running(opCtx)
	cancel()
	if err != nil {
		res.InFlight = len(r.ops)
		err = fmt.Errorf("list instances: %w", err)
		if r.unsaved {
			err = errors.Join(err, r.save())
		}
		return res, err
	}
	r.observe(running, now)
	if !d.Frozen {
		r.decide(d, running, now, &res)
	}
	res.InFlight = len(r.ops)
	if r.unsaved {
		CrashPoint(CrashBeforeStateWrite)
	}
	return res, r.save()
}

// save writes the state when it differs from what was last written (a
// pass that changed nothing, most of them, costs no write and no fsync),
// so that a crash at any moment leaves either the old or the new file
// (WriteFileAtomic).
func (r *Reconciler) save() error {
	data, err := json.MarshalIndent(r.state, "", "  ")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if !bytes.Equal(data, r.saved) {
		if err := WriteFileAtomic(filepath.Join(r.cfg.StateDir, stateFile), data, 0o600); err != nil {
			return fmt.Errorf("save state: %w", err)
		}
		r.saved = data
	}
	r.unsaved = false
	return nil
}

// decide starts an operation for each instance that needs one and has
// none in flight, while workers are free. Releases come first: another
// node may wait for one (break before make), and they free what new
// instances need. Instances left for lack of a worker are decided again at
// a later pass (an operation that ends wakes the owner).
func (r *Reconciler) decide(d Desired, running map[string]Process, now time.Time, res *Result) {
	clear(r.pulling)
	clear(r.wanted)
	mine := map[string]planner.Placement{}
	elsewhere := map[string]planner.Placement{}
	for _, pl := range d.Plan.Placements {
		if pl.Node == r.cfg.Node {
			mine[pl.Instance] = pl
		} else {
			elsewhere[pl.Instance] = pl
		}
	}
	maps.DeleteFunc(r.held, func(name string, _ retry) bool {
		_, placed := mine[name]
		return !placed && r.state.Instances[name] == nil // gone for good
	})
	// Instances this node holds but should not run.
	for _, name := range slices.Sorted(maps.Keys(r.state.Instances)) {
		if _, ok := mine[name]; ok || r.busy(name, now) {
			continue
		}
		if o := r.release(d, name, elsewhere, running); o != nil && r.drained(d, o, now, res) {
			r.dispatch(o)
		}
	}
	// Instances this node should run.
	for _, name := range slices.Sorted(maps.Keys(mine)) {
		inst := d.Model.Instance(name)
		if inst == nil {
			continue
		}
		if r.busy(name, now) {
			r.keepPulls(inst.Spec)
			continue
		}
		if o := r.relive(name, running); o != nil {
			r.dispatch(o)
			continue
		}
		o, err := r.ensure(inst, mine[name], running, now)
		if err != nil {
			res.Waiting[name] = err // ensure only ever waits
			continue
		}
		if !r.sourcesReady(inst.Spec, now) {
			// Pulled first: the instance it replaces (if any) keeps
			// running meanwhile. A rollout's held-back replicas get their
			// image ahead of their turn.
			if o != nil && o.start {
				r.pulling[name] = o
			}
			continue
		}
		if o != nil && r.drained(d, o, now, res) {
			r.dispatch(o)
		}
	}
	r.prunePulls()
	r.notePulling(now)
	maps.DeleteFunc(r.drain, func(name string, _ time.Time) bool { return !slices.Contains(res.Draining, name) })
}

// drained reports whether operation o may run now: unless it stops an
// instance that serves a Service, at once. Such an instance first leaves
// every node's endpoints (the plan that releases it lists it nowhere, and
// this node's proxies follow that plan before its pass), and its stop
// waits until the newest report of every other alive node shows that
// node's proxies without it, or DrainTimeout has passed, so that no node
// sends it a new connection once it receives SIGTERM. Connections already
// relayed to it go on; its command has its terminationGracePeriod to end
// them. An instance that waits is listed in res.Draining, the nodes it
// waits for in res.DrainWaits (the agent asks them for their reports over
// the gossip ring, when there is one).
func (r *Reconciler) drained(d Desired, o *operation, now time.Time, res *Result) bool {
	st := r.state.Instances[o.name]
	if !o.stop || st == nil || st.Service == "" || st.State != report.StateRunning {
		return true
	}
	addr, err := parseAddr(st.Address)
	if err != nil {
		return true
	}
	alive := map[string]bool{}
	for _, n := range d.Plan.Nodes {
		alive[n.Name] = n.Alive
	}
	newest := map[string]*report.Report{}
	var readySince time.Time // of this node's copy, as its own report says
	for i := range d.Reports {
		rep := &d.Reports[i]
		if rep.Node == r.cfg.Node {
			if ri := rep.Instance(o.name); ri != nil && ri.ReadySince.After(readySince) {
				readySince = ri.ReadySince
			}
		}
		if cur := newest[rep.Node]; rep.Node != r.cfg.Node && alive[rep.Node] && (cur == nil || planner.Newer(rep, cur)) {
			newest[rep.Node] = rep
		}
	}
	// A node whose newest report lists the instance still proxies to it;
	// one whose newest report is older than the instance's readiness may
	// not have published since it began to (a release soon after the
	// instance turned ready): both are waited for.
	var listing []string
	for _, node := range slices.Sorted(maps.Keys(newest)) {
		if rep := newest[node]; proxies(rep, st.Service, addr) || rep.Time.Before(readySince) {
			listing = append(listing, node)
		}
	}
	if len(listing) == 0 {
		return true
	}
	since, ok := r.drain[o.name]
	if !ok {
		since = now
		r.drain[o.name] = now
		r.log.Info("draining instance: waiting for the other nodes' proxies to stop sending it connections", "instance", o.name, "nodes", strings.Join(listing, ", "))
	}
	if now.Sub(since) >= r.cfg.DrainTimeout {
		r.log.Warn("drain timed out: stopping the instance although nodes may still send it connections", "instance", o.name,
			"nodes", strings.Join(listing, ", "), "timeout", r.cfg.DrainTimeout)
		return true
	}
	res.Draining = append(res.Draining, o.name)
	for _, node := range listing {
		if !slices.Contains(res.DrainWaits, node) {
			res.DrainWaits = append(res.DrainWaits, node)
		}
	}
	return false
}

// proxies reports whether a node's report shows its proxy of Service
// service sending connections to addr.
func proxies(rep *report.Report, service string, addr netip.Addr) bool {
	for _, s := range rep.Services {
		if s.Name != service {
			continue
		}
		for _, ep := range s.Endpoints {
			if ap, err := netip.ParseAddrPort(ep); err == nil && ap.Addr() == addr {
				return true
			}
		}
	}
	return false
}

// unwell is a running instance whose liveness (or startup) check failed:
// the process it names is to be restarted.
type unwell struct {
	pid       int
	startTime uint64
	why       string
}

// Restart asks for the named instance's process (pid and startTime, as
// InstanceState has them) to be restarted, as a crash, because a check
// failed (why): a later pass stops it, without a drain (it is failing;
// its report says it is not ready), and it starts again after the restart
// backoff. A request for a process that no longer runs is dropped. Only
// the owner calls it.
func (r *Reconciler) Restart(name string, pid int, startTime uint64, why string) {
	if st := r.state.Instances[name]; st != nil && st.PID == pid && st.StartTime == startTime && pid != 0 {
		r.unwell[name] = unwell{pid: pid, startTime: startTime, why: why}
	}
}

// Proven records that the named instance was seen ready at spec hash
// hash: from then on (the state keeps it across agent restarts) its
// report carries no specSince at that hash, so that a crash or an
// unreadiness later is not taken for a replica that never became ready
// within its Service's progressDeadline (which would pause a rollout that
// is not under way, or with failureAction continue count it available).
// A new spec starts the clock again. Only the owner calls it.
func (r *Reconciler) Proven(name, hash string) {
	if st := r.state.Instances[name]; st != nil && st.SpecHash == hash && st.ProvenHash != hash {
		st.ProvenHash = hash
		r.unsaved = true
	}
}

// relive returns the operation that stops an instance whose check failed,
// or nil.
func (r *Reconciler) relive(name string, running map[string]Process) *operation {
	u, ok := r.unwell[name]
	if !ok {
		return nil
	}
	st := r.state.Instances[name]
	p, isRunning := running[name]
	if st == nil || !isRunning || p.PID != u.pid || p.StartTime != u.startTime {
		delete(r.unwell, name) // it is no longer the process that failed
		return nil
	}
	return &operation{name: name, why: whyUnwell, stop: true, grace: time.Duration(st.Spec.TerminationGracePeriod), reason: u.why}
}

// liveSpec applies to a running instance's recorded spec what changes
// without a restart.
func liveSpec(s *render.JailSpec, to render.JailSpec) {
	s.Resources, s.RestartPolicy = to.Resources, to.RestartPolicy
	s.Checks, s.TerminationGracePeriod = to.Checks, to.TerminationGracePeriod
}

// busy reports whether an instance's operation is in flight, or its last
// one failed less than its retry delay ago.
func (r *Reconciler) busy(name string, now time.Time) bool {
	return r.ops[name] != nil || now.Before(r.held[name].at)
}

// observe folds what the driver says runs into the state: processes an
// earlier run started are adopted, and instances that were running and are
// gone are marked as exited. An instance with an operation in flight is
// left to its operation, whose outcome says what became of it.
func (r *Reconciler) observe(running map[string]Process, now time.Time) {
	for name, p := range running {
		if r.ops[name] != nil {
			continue
		}
		st := r.state.Instances[name]
		if st == nil {
			// Started by an earlier run that crashed before saving its state.
			st = &InstanceState{SpecHash: p.SpecHash, State: report.StateRunning}
			r.state.Instances[name] = st
			r.log.Info("adopted instance", "instance", name, "pid", p.PID)
		}
		if st.PID != p.PID || st.StartTime != p.StartTime {
			st.PID, st.StartTime = p.PID, p.StartTime
			if st.SpecHash == "" || st.State != report.StateRunning {
				st.SpecHash = p.SpecHash
			}
			if st.Started.IsZero() {
				st.Started = p.Started
			}
		}
		st.State = report.StateRunning
	}
	for name, st := range r.state.Instances {
		if _, ok := running[name]; ok || st.State != report.StateRunning || r.ops[name] != nil {
			continue
		}
		exit, known := r.cfg.Driver.Exited(name)
		if !known {
			exit = Exit{Code: -1, At: now}
		}
		st.LastExit = &ExitRecord{Code: exit.Code, Known: exit.Known, At: exit.At}
		st.PID, st.StartTime = 0, 0
		// Back off, unless it stayed up long enough to start afresh.
		if !st.Started.IsZero() && exit.At.Sub(st.Started) >= resetAfter {
			st.Backoff = 0
		}
		st.Backoff = nextBackoff(st.Backoff)
		st.NextRestart = exit.At.Add(st.Backoff)
		st.State = report.StateCrashLoop
		st.Error = exitText(exit)
		if !restartable(st.Spec.RestartPolicy, exit) {
			st.State = report.StateFailed
			if !exit.Failed() {
				st.State = report.StateStopped
			}
		}
		r.log.Info("instance exited", "instance", name, "code", exit.Code, "known", exit.Known, "state", st.State)
	}
}

func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return minBackoff
	}
	return min(2*b, maxBackoff)
}

func exitText(e Exit) string {
	switch {
	case !e.Known:
		return "exited while the agent was away"
	case e.Code < 0:
		return "killed by a signal"
	default:
		return fmt.Sprintf("exited with code %d", e.Code)
	}
}

// restartable applies the restart policy to an exit.
func restartable(policy string, e Exit) bool {
	switch policy {
	case "Never":
		return false
	case "OnFailure":
		return e.Failed()
	default:
		return true
	}
}

// adopted completes the state of an instance adopted with none saved (the
// agent stopped between its start and the state's save): it runs at this
// placement's address, with the image, network and volumes of inst, which
// only a replace-class change would alter, and with all of inst's spec
// when the hashes are equal.
func adopted(st *InstanceState, inst *render.Instance, pl planner.Placement, class render.ChangeClass) {
	st.Service, st.Address, st.Generation = inst.Service, pl.Address.String(), pl.Generation
	if class == "" {
		st.Spec = inst.Spec
		return
	}
	st.Spec.Image, st.Spec.Network, st.Spec.Volumes, st.Spec.Artifacts = inst.Spec.Image, inst.Spec.Network, inst.Spec.Volumes, inst.Spec.Artifacts
}

// ensure decides what an instance placed on this node needs to run its
// current spec, and returns the operation that does it: nil when it needs
// nothing, or an error wrapping ErrWaiting when it must wait for another
// node. It changes the state only when no driver call is needed.
func (r *Reconciler) ensure(inst *render.Instance, pl planner.Placement, running map[string]Process, now time.Time) (*operation, error) {
	st := r.state.Instances[inst.Name]
	_, isRunning := running[inst.Name]
	o := &operation{
		name: inst.Name, gen: pl.Generation, volumes: inst.Spec.Volumes,
		spec: InstanceSpec{
			Name: inst.Name, Service: inst.Service, Node: r.cfg.Node, Address: pl.Address,
			Spec: inst.Spec, SpecHash: inst.SpecHash,
			Artifacts: r.cachedArtifacts(inst.Spec), MaxUnpacked: r.maxUnpacked(),
		},
	}
	if isRunning {
		class := render.ClassifyHashChange(st.SpecHash, inst.SpecHash)
		if st.Address == "" && class != render.ChangeReplace {
			adopted(st, inst, pl, class)
		}
		switch class {
		case "", render.ChangeLive:
			if st.Spec.Resources == inst.Spec.Resources {
				liveSpec(&st.Spec, inst.Spec)
				st.SpecHash = inst.SpecHash
				st.Error = ""
				return nil, nil
			}
			o.why = whyApply
			return o, nil
		case render.ChangeRestart:
			if !pl.Released {
				return nil, nil // the rollout will release it
			}
			o.why, o.stop, o.grace = whyRestart, true, time.Duration(st.Spec.TerminationGracePeriod)
		case render.ChangeReplace:
			if !pl.Released {
				return nil, nil
			}
			o.why, o.stop, o.destroy, o.grace = whyReplace, true, true, time.Duration(st.Spec.TerminationGracePeriod)
		}
		o.start, o.kind = true, startUpdate
		return o, nil
	}
	if st != nil {
		switch st.State {
		case report.StateFailed, report.StateStopped:
			if st.SpecHash == inst.SpecHash {
				return nil, nil // finished for good under this spec; a new spec runs again
			}
		case report.StateCrashLoop:
			if now.Before(st.NextRestart) && st.SpecHash == inst.SpecHash {
				return nil, nil // backing off
			}
		}
	}
	// Break before make: a stateful instance starts here only once no
	// other node's report lists it as anything but stopped (the planner
	// names those nodes, alive or not).
	if len(pl.WaitsFor) > 0 {
		return nil, fmt.Errorf("%w for %s to report it stopped before starting it here", ErrWaiting, strings.Join(pl.WaitsFor, ", "))
	}
	o.why, o.start = whyStart, true
	// A replace-class change to an instance that is not running (crashed,
	// failed, stopped) still needs a fresh root.
	if st != nil && st.SpecHash != "" && render.ClassifyHashChange(st.SpecHash, inst.SpecHash) == render.ChangeReplace {
		o.destroy = true
	}
	switch {
	case st == nil:
		o.kind = startFresh
	case st.SpecHash != inst.SpecHash:
		o.kind = startUpdate
		o.counts.Restarted++
	case st.LastExit != nil:
		o.kind = startCrash
	default:
		o.kind = startFresh // its starts under this spec all failed so far
	}
	return o, nil
}

// Why an instance is started.
type startKind int

const (
	startFresh  startKind = iota // first start on this node
	startCrash                   // after its process ended: a restart
	startUpdate                  // with a new spec (counted when decided)
)

// release decides what to do with an instance this node holds that its
// share of the plan no longer has: nil to keep it, or the operation that
// stops and removes it.
func (r *Reconciler) release(d Desired, name string, elsewhere map[string]planner.Placement, running map[string]Process) *operation {
	_, isRunning := running[name]
	inst := d.Model.Instance(name)
	pl, placed := elsewhere[name]
	switch {
	case inst == nil:
		// Deleted from the specs: stop it and remove its root; volumes stay.
	case !placed && d.Leaving:
		// The node leaves: stop it even though it can run nowhere else.
	case !placed && inst.Surge:
		// A surge instance whose rollout is over.
	case !placed:
		// Unschedulable anywhere: keep what runs rather than nothing.
		return nil
	case inst.Stateful:
		// Break before make: stop now; the new node starts it once this
		// node's report shows it stopped.
	case isRunning && !runsOn(d, name, pl.Node):
		// Make before break: keep it serving until its new node reports
		// it ready. A copy that does not run here serves nothing: it goes
		// at once.
		return nil
	}
	o := &operation{name: name, why: whyRelease, stop: isRunning, destroy: true, reason: releaseReason(inst, placed, pl)}
	if st := r.state.Instances[name]; st != nil {
		o.grace = time.Duration(st.Spec.TerminationGracePeriod)
	}
	return o
}

func releaseReason(inst *render.Instance, placed bool, pl planner.Placement) string {
	switch {
	case inst == nil:
		return "deleted from the specs"
	case !placed && inst.Surge:
		return "surge instance, the rollout is over"
	case !placed:
		return "this node left the inventory"
	case inst.Stateful:
		return "stateful, moved to " + pl.Node
	default:
		return "runs on " + pl.Node + " now"
	}
}

// runsOn reports whether node's report shows the instance running and
// ready (the plan then drains this node's copy).
func runsOn(d Desired, name, node string) bool {
	for _, rep := range d.Reports {
		if rep.Node == node {
			if ri := rep.Instance(name); ri != nil && ri.IsReady() {
				return true
			}
		}
	}
	return false
}

// DeleteVolume destroys a volume for good, refusing while an instance this
// node holds mounts it or is being started with it.
func (r *Reconciler) DeleteVolume(ctx context.Context, name string) error {
	shown := r.Instances()
	for _, inst := range slices.Sorted(maps.Keys(shown)) {
		st := shown[inst]
		if st.State != report.StateRunning && st.State != report.StateStarting {
			continue
		}
		for _, v := range st.Spec.Volumes {
			if v.Name == name {
				return fmt.Errorf("volume %s is mounted by %s: %w", name, inst, ErrBusy)
			}
		}
	}
	opCtx, cancel := r.op(ctx)
	defer cancel()
	return r.cfg.Driver.DeleteVolume(opCtx, name)
}

// Status returns what the node holds, for its report: every instance of
// the state, and those an operation is starting (state starting, with the
// address and spec hash it starts them with). An instance being stopped
// keeps its state until its operation has ended.
func (r *Reconciler) Status(ctx context.Context) ([]report.Instance, []report.Volume, error) {
	shown := r.Instances()
	var instances []report.Instance
	for _, name := range slices.Sorted(maps.Keys(shown)) {
		st := shown[name]
		ri := report.Instance{Name: name, State: st.State, SpecHash: st.SpecHash, Restarts: st.Restarts, Error: st.Error, Generation: st.Generation}
		if st.ProvenHash != st.SpecHash {
			ri.SpecSince = st.SpecSince.UTC().Truncate(time.Millisecond)
		}
		if a, err := parseAddr(st.Address); err == nil {
			ri.Address = a
		}
		if o := r.pulling[name]; o != nil {
			if key := r.waitsFor(o.spec.Spec); key != "" {
				ri.Pull = r.pullStatus(name, key)
			}
		}
		instances = append(instances, ri)
	}
	opCtx, cancel := r.op(ctx)
	defer cancel()
	names, err := r.cfg.Driver.Volumes(opCtx)
	if err != nil {
		return instances, nil, err
	}
	var volumes []report.Volume
	for _, n := range names {
		volumes = append(volumes, report.Volume{Name: n})
	}
	return instances, volumes, nil
}

// Instances returns a copy of the state of every instance, as Status shows
// it (an instance being started is starting), for the local API and the
// metrics.
func (r *Reconciler) Instances() map[string]InstanceState {
	out := make(map[string]InstanceState, len(r.state.Instances)+len(r.ops))
	for k, v := range r.state.Instances {
		out[k] = *v
	}
	for name, o := range r.ops {
		if !o.start {
			continue
		}
		st := out[name]
		st.State = report.StateStarting
		st.Service, st.Address, st.SpecHash = o.spec.Service, o.spec.Address.String(), o.spec.SpecHash
		st.Spec, st.Generation = o.spec.Spec, o.gen
		out[name] = st
	}
	for name, o := range r.pulling {
		if st, ok := out[name]; ok && st.State == report.StateRunning {
			continue // the copy it replaces runs meanwhile
		}
		st := out[name]
		st.State, st.Error = report.StatePulling, ""
		st.Service, st.Address, st.SpecHash = o.spec.Service, o.spec.Address.String(), o.spec.SpecHash
		st.Spec, st.Generation = o.spec.Spec, o.gen
		out[name] = st
	}
	return out
}
