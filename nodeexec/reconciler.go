package nodeexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

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

// Config configures a Reconciler.
type Config struct {
	Node     string
	Driver   Driver
	StateDir string
	Logger   *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// StopGrace is how long an instance has to stop before it is killed.
	StopGrace time.Duration
	// OpTimeout bounds each driver operation.
	OpTimeout time.Duration
}

// Desired is this node's view of what should run: the model of the last
// good commit, the plan, and the reports of the other nodes (which tell when
// a moved instance runs on its new node).
type Desired struct {
	Model   *render.Model
	Plan    *planner.Plan
	Reports []report.Report
	// Frozen (the cluster's suspend) keeps the node as it is: exits are
	// still observed and recorded, but nothing is started, stopped or
	// changed.
	Frozen bool
	// Leaving (the node is no longer in the inventory) releases every
	// instance, including those that can be placed nowhere else: a node
	// leaving the cluster never keeps anything running.
	Leaving bool
}

// Result sums up a pass.
type Result struct {
	Created, Restarted, Replaced, Stopped, Removed int
	// Errors are per-instance problems; one broken instance never stops
	// the others.
	Errors map[string]error
	// Waiting are the instances placed here that wait for another node
	// (ErrWaiting), with what they wait for.
	Waiting map[string]error
}

// Reconciler makes the node match its share of the plan. It is not safe for
// concurrent use: one goroutine (the agent's loop) owns it.
type Reconciler struct {
	cfg   Config
	state *State
	log   *slog.Logger
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	st, err := LoadState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, state: st, log: cfg.Logger}, nil
}

func (r *Reconciler) op() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.cfg.OpTimeout)
}

// Pass runs one reconcile pass against d and saves the state.
func (r *Reconciler) Pass(ctx context.Context, d Desired) (Result, error) {
	res := Result{Errors: map[string]error{}, Waiting: map[string]error{}}
	opCtx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	running, err := r.cfg.Driver.Running(opCtx)
	cancel()
	if err != nil {
		return res, fmt.Errorf("list instances: %w", err)
	}
	now := r.cfg.Now()
	r.observe(running, now)
	if d.Frozen {
		return res, r.state.Save(r.cfg.StateDir)
	}

	mine := map[string]planner.Placement{}
	elsewhere := map[string]planner.Placement{}
	for _, pl := range d.Plan.Placements {
		if pl.Node == r.cfg.Node {
			mine[pl.Instance] = pl
		} else {
			elsewhere[pl.Instance] = pl
		}
	}
	// Instances this node should run.
	for _, name := range slices.Sorted(mapKeys(mine)) {
		if ctx.Err() != nil {
			break
		}
		pl := mine[name]
		inst := d.Model.Instance(name)
		if inst == nil {
			continue
		}
		err := r.ensure(ctx, d, inst, pl, running, now, &res)
		if errors.Is(err, ErrWaiting) {
			res.Waiting[name] = err
			continue
		}
		if err != nil {
			res.Errors[name] = err
			if st := r.state.Instances[name]; st != nil {
				st.Error = err.Error()
			}
			r.log.Warn("instance", "instance", name, "err", err)
		}
	}
	// Instances this node holds but should not run.
	for _, name := range slices.Sorted(mapKeys(r.state.Instances)) {
		if _, ok := mine[name]; ok || ctx.Err() != nil {
			continue
		}
		if err := r.release(ctx, d, name, elsewhere, running, &res); err != nil {
			res.Errors[name] = err
			r.state.Instances[name].Error = err.Error()
			r.log.Warn("instance", "instance", name, "err", err)
		}
	}
	CrashPoint(CrashBeforeStateWrite)
	if err := r.state.Save(r.cfg.StateDir); err != nil {
		return res, fmt.Errorf("save state: %w", err)
	}
	return res, nil
}

// observe folds what the driver says runs into the state: processes an
// earlier run started are adopted, and instances that were running and are
// gone are marked as exited.
func (r *Reconciler) observe(running map[string]Process, now time.Time) {
	for name, p := range running {
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
		if _, ok := running[name]; ok || st.State != report.StateRunning {
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

// ensure makes one instance placed on this node run its current spec.
func (r *Reconciler) ensure(ctx context.Context, d Desired, inst *render.Instance, pl planner.Placement, running map[string]Process, now time.Time, res *Result) error {
	st := r.state.Instances[inst.Name]
	_, isRunning := running[inst.Name]
	spec := r.specFor(d, inst, pl)
	if isRunning {
		class := render.ClassifyHashChange(st.SpecHash, inst.SpecHash)
		if st.Address == "" && class != render.ChangeReplace {
			adopted(st, inst, spec, pl, class)
		}
		switch class {
		case "":
			return r.applyLive(ctx, st, inst, spec)
		case render.ChangeLive:
			if err := r.applyLive(ctx, st, inst, spec); err != nil {
				return err
			}
			st.SpecHash = inst.SpecHash
			return nil
		case render.ChangeRestart:
			if !pl.Released {
				return nil // the rollout will release it
			}
			if err := r.stop(ctx, inst.Name); err != nil {
				return err
			}
			res.Restarted++
		case render.ChangeReplace:
			if !pl.Released {
				return nil
			}
			if err := r.stop(ctx, inst.Name); err != nil {
				return err
			}
			opCtx, cancel := r.op()
			err := r.cfg.Driver.Destroy(opCtx, inst.Name)
			cancel()
			if err != nil {
				return fmt.Errorf("destroy for replace: %w", err)
			}
			res.Replaced++
		}
		return r.start(ctx, inst, spec, st, pl.Generation, now, res, startUpdate)
	}
	if st != nil {
		switch st.State {
		case report.StateFailed, report.StateStopped:
			if st.SpecHash == inst.SpecHash {
				return nil // finished for good under this spec; a new spec runs again
			}
		case report.StateCrashLoop:
			if now.Before(st.NextRestart) && st.SpecHash == inst.SpecHash {
				return nil // backing off
			}
		}
	}
	// A replace-class change to an instance that is not running (crashed,
	// failed, stopped) still needs a fresh root.
	if st != nil && st.SpecHash != "" && render.ClassifyHashChange(st.SpecHash, inst.SpecHash) == render.ChangeReplace {
		opCtx, cancel := r.op()
		err := r.cfg.Driver.Destroy(opCtx, inst.Name)
		cancel()
		if err != nil {
			return fmt.Errorf("destroy for replace: %w", err)
		}
	}
	// Break before make: a stateful instance starts here only once no
	// other node's report lists it as anything but stopped (the planner
	// names those nodes, alive or not).
	if len(pl.WaitsFor) > 0 {
		return fmt.Errorf("%w for %s to report it stopped before starting it here", ErrWaiting, strings.Join(pl.WaitsFor, ", "))
	}
	kind := startFresh
	if st != nil && st.LastExit != nil && st.SpecHash == inst.SpecHash {
		kind = startCrash
	} else if st != nil {
		kind = startUpdate
		res.Restarted++
	}
	return r.start(ctx, inst, spec, st, pl.Generation, now, res, kind)
}

// Why an instance is started.
type startKind int

const (
	startFresh  startKind = iota // first start on this node
	startCrash                   // after its process ended: a restart
	startUpdate                  // with a new spec (counted by the caller)
)

// adopted completes the state of an instance adopted with none saved (the
// agent stopped between its start and the state's save): it runs at this
// placement's address, with the image, network and volumes of inst, which
// only a replace-class change would alter, and with all of inst's spec
// when the hashes are equal.
func adopted(st *InstanceState, inst *render.Instance, spec InstanceSpec, pl planner.Placement, class render.ChangeClass) {
	st.Service, st.Address, st.Generation = inst.Service, spec.Address.String(), pl.Generation
	if class == "" {
		st.Spec = inst.Spec
		return
	}
	st.Spec.Image, st.Spec.Network, st.Spec.Volumes = inst.Spec.Image, inst.Spec.Network, inst.Spec.Volumes
}

// specFor builds what the driver needs to run inst at its planned address.
func (r *Reconciler) specFor(d Desired, inst *render.Instance, pl planner.Placement) InstanceSpec {
	return InstanceSpec{
		Name: inst.Name, Service: inst.Service, Node: r.cfg.Node, Address: pl.Address,
		Spec: inst.Spec, SpecHash: inst.SpecHash,
	}
}

func (r *Reconciler) applyLive(ctx context.Context, st *InstanceState, inst *render.Instance, spec InstanceSpec) error {
	if st.Spec.Resources != inst.Spec.Resources {
		opCtx, cancel := r.op()
		err := r.cfg.Driver.Apply(opCtx, inst.Name, inst.Spec.Resources)
		cancel()
		if err != nil {
			return fmt.Errorf("apply resources: %w", err)
		}
	}
	st.Spec.Resources = inst.Spec.Resources
	st.Spec.RestartPolicy = inst.Spec.RestartPolicy
	st.Error = ""
	return nil
}

// start creates the volumes, then starts the instance, recording it.
func (r *Reconciler) start(ctx context.Context, inst *render.Instance, spec InstanceSpec, st *InstanceState, gen int, now time.Time, res *Result, kind startKind) error {
	spec.Volumes = map[string]string{}
	for _, v := range inst.Spec.Volumes {
		opCtx, cancel := r.op()
		path, err := r.cfg.Driver.EnsureVolume(opCtx, v.Name, v.Size)
		cancel()
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		spec.Volumes[v.Name] = path
		CrashPoint(CrashAfterVolume)
	}
	if st == nil {
		st = &InstanceState{}
		r.state.Instances[inst.Name] = st
	}
	opCtx, cancel := r.op()
	p, err := r.cfg.Driver.Start(opCtx, spec)
	cancel()
	if errors.Is(err, ErrAlreadyRunning) {
		err = nil // found running: adopt it as it is
	}
	if err != nil {
		st.State = report.StateCrashLoop
		st.Backoff = nextBackoff(st.Backoff)
		st.NextRestart = now.Add(st.Backoff)
		return fmt.Errorf("start: %w", err)
	}
	CrashPoint(CrashAfterStart)
	switch kind {
	case startCrash:
		st.Restarts++
		res.Restarted++
	case startFresh:
		res.Created++
	}
	*st = InstanceState{
		Service: inst.Service, Address: spec.Address.String(), SpecHash: inst.SpecHash, Spec: inst.Spec,
		PID: p.PID, StartTime: p.StartTime, Started: now, State: report.StateRunning,
		Restarts: st.Restarts, Backoff: st.Backoff, LastExit: st.LastExit, Generation: gen,
	}
	r.log.Info("started instance", "instance", inst.Name, "pid", p.PID, "address", spec.Address, "specHash", short(inst.SpecHash))
	return nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (r *Reconciler) stop(ctx context.Context, name string) error {
	opCtx, cancel := context.WithTimeout(ctx, r.cfg.StopGrace+r.cfg.OpTimeout)
	defer cancel()
	if err := r.cfg.Driver.Stop(opCtx, name, r.cfg.StopGrace); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if st := r.state.Instances[name]; st != nil {
		st.PID, st.StartTime, st.State = 0, 0, report.StateStopped
	}
	return nil
}

// release handles an instance this node holds that its share of the plan
// no longer has.
func (r *Reconciler) release(ctx context.Context, d Desired, name string, elsewhere map[string]planner.Placement, running map[string]Process, res *Result) error {
	_, isRunning := running[name]
	inst := d.Model.Instance(name)
	pl, placed := elsewhere[name]
	switch {
	case inst == nil:
		// Deleted from the specs: stop it and remove its root; volumes stay.
	case !placed && d.Leaving:
		// The node leaves: stop it even though it can run nowhere else.
	case !placed:
		// Unschedulable anywhere: keep what runs rather than nothing.
		return nil
	case inst.Stateful:
		// Break before make: stop now; the new node starts it once this
		// node's report shows it stopped.
	case !runsOn(d, name, pl.Node):
		// Make before break: keep it until its new node reports it running.
		return nil
	}
	if isRunning {
		if err := r.stop(ctx, name); err != nil {
			return err
		}
		res.Stopped++
	}
	opCtx, cancel := r.op()
	err := r.cfg.Driver.Destroy(opCtx, name)
	cancel()
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	delete(r.state.Instances, name)
	res.Removed++
	r.log.Info("removed instance", "instance", name, "reason", releaseReason(inst, placed, pl))
	return nil
}

func releaseReason(inst *render.Instance, placed bool, pl planner.Placement) string {
	switch {
	case inst == nil:
		return "deleted from the specs"
	case !placed:
		return "this node left the inventory"
	case inst.Stateful:
		return "stateful, moved to " + pl.Node
	default:
		return "runs on " + pl.Node + " now"
	}
}

// runsOn reports whether node's report shows the instance running.
func runsOn(d Desired, name, node string) bool {
	for _, rep := range d.Reports {
		if rep.Node == node {
			if ri := rep.Instance(name); ri != nil && ri.State == report.StateRunning {
				return true
			}
		}
	}
	return false
}

// DeleteVolume destroys a volume for good, refusing while an instance this
// node holds mounts it.
func (r *Reconciler) DeleteVolume(ctx context.Context, name string) error {
	for inst, st := range r.state.Instances {
		if st.State != report.StateRunning {
			continue
		}
		for _, v := range st.Spec.Volumes {
			if v.Name == name {
				return fmt.Errorf("volume %s is mounted by %s: %w", name, inst, ErrBusy)
			}
		}
	}
	opCtx, cancel := r.op()
	defer cancel()
	return r.cfg.Driver.DeleteVolume(opCtx, name)
}

// Status returns what the node holds, for its report.
func (r *Reconciler) Status(ctx context.Context) ([]report.Instance, []report.Volume, error) {
	var instances []report.Instance
	for _, name := range slices.Sorted(mapKeys(r.state.Instances)) {
		st := r.state.Instances[name]
		ri := report.Instance{Name: name, State: st.State, SpecHash: st.SpecHash, Restarts: st.Restarts, Error: st.Error, Generation: st.Generation}
		if a, err := parseAddr(st.Address); err == nil {
			ri.Address = a
		}
		instances = append(instances, ri)
	}
	opCtx, cancel := r.op()
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

// Instances returns a copy of the state of every instance, for the local API.
func (r *Reconciler) Instances() map[string]InstanceState {
	out := make(map[string]InstanceState, len(r.state.Instances))
	for k, v := range r.state.Instances {
		out[k] = *v
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
