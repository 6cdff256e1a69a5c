package nodeexec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// operation is the whole step a pass decided for one instance: apply its
// limits, or stop it, destroy its root, create its volumes and start it (in
// that order, each only when asked). A pass decides it on the owner's
// goroutine; one of the Reconciler's goroutines runs it against the
// driver, recording what it did in the outcome fields; a later pass folds
// the outcome into the state. The goroutine writes the outcome fields
// before handing the operation back under Reconciler.mu, and the owner
// reads them only after taking it back under the same lock.
type operation struct {
	name string
	why  opWhy
	// What to do, decided by the pass.
	stop, destroy, start bool
	spec                 InstanceSpec    // the instance's spec, without the volume paths
	volumes              []render.Volume // to create before the start
	gen                  int             // the placement's generation
	kind                 startKind       // why it is started
	reason               string          // why a release removes it, for the log
	grace                time.Duration   // between SIGTERM and SIGKILL, when it stops the instance

	// The outcome, written by the operation's goroutine.
	counts      Result // Created, Restarted, ... (no maps)
	stopped     bool   // the instance was stopped
	proc        Process
	started     bool // the instance runs proc
	startFailed bool // the driver's Start failed: a crash, with backoff
	err         error
}

// What an operation is for.
type opWhy int

const (
	whyApply   opWhy = iota // apply a running instance's limits (a live change)
	whyStart                // start an instance that does not run
	whyRestart              // restart a running instance with a new spec
	whyReplace              // replace a running instance: stop, destroy, start
	whyRelease              // stop it if it runs, destroy it, forget it
	whyUnwell               // stop it because a check failed: a crash, restarted with backoff
)

func (w opWhy) String() string {
	return [...]string{"apply", "start", "restart", "replace", "release", "unwell"}[w]
}

// dispatch starts o on a goroutine of its own when a worker is free, and
// reports whether it did. Only the owner calls it.
func (r *Reconciler) dispatch(o *operation) bool {
	if len(r.ops) >= r.cfg.MaxParallel {
		return false
	}
	r.ops[o.name] = o
	r.log.Debug("operation", "instance", o.name, "why", o.why, "stop", o.stop, "destroy", o.destroy, "start", o.start)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		o.err = r.work(r.ctx, o)
		r.mu.Lock()
		r.done = append(r.done, o)
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}()
	return true
}

// work runs an operation's driver calls, each with its own timeout, and
// records what it did in o. It never touches the state.
func (r *Reconciler) work(ctx context.Context, o *operation) error {
	if o.why == whyApply {
		opCtx, cancel := r.op(ctx)
		defer cancel()
		if err := r.cfg.Driver.Apply(opCtx, o.name, o.spec.Spec.Resources); err != nil {
			return fmt.Errorf("apply resources: %w", err)
		}
		return nil
	}
	if o.stop {
		grace := cmp.Or(o.grace, r.cfg.StopGrace)
		opCtx, cancel := context.WithTimeout(ctx, grace+r.cfg.OpTimeout)
		err := r.cfg.Driver.Stop(opCtx, o.name, grace)
		cancel()
		if err != nil {
			return fmt.Errorf("stop: %w", err)
		}
		o.stopped = true
		switch o.why {
		case whyRestart:
			o.counts.Restarted++
		case whyRelease:
			o.counts.Stopped++
		}
	}
	if o.destroy {
		opCtx, cancel := r.op(ctx)
		err := r.cfg.Driver.Destroy(opCtx, o.name)
		cancel()
		switch {
		case err != nil && o.why == whyRelease:
			return fmt.Errorf("destroy: %w", err)
		case err != nil:
			return fmt.Errorf("destroy for replace: %w", err)
		case o.why == whyReplace:
			o.counts.Replaced++
		case o.why == whyRelease:
			o.counts.Removed++
		}
	}
	if !o.start {
		return nil
	}
	spec := o.spec
	spec.Volumes = map[string]string{}
	for _, v := range o.volumes {
		opCtx, cancel := r.op(ctx)
		path, err := r.cfg.Driver.EnsureVolume(opCtx, v.Name, v.Size)
		cancel()
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		spec.Volumes[v.Name] = path
		CrashPoint(CrashAfterVolume)
	}
	opCtx, cancel := r.op(ctx)
	if len(spec.Artifacts) > 0 {
		// Placing them copies (or extracts) up to gigabytes: bounded as
		// a pull is, not as a driver call.
		cancel()
		opCtx, cancel = context.WithTimeout(ctx, max(pullTimeout, r.cfg.OpTimeout))
	}
	p, err := r.cfg.Driver.Start(opCtx, spec)
	cancel()
	if errors.Is(err, ErrAlreadyRunning) {
		err = nil // found running: adopt it as it is
	}
	if err != nil {
		o.startFailed = true
		return fmt.Errorf("start: %w", err)
	}
	CrashPoint(CrashAfterStart)
	o.proc, o.started = p, true
	switch o.kind {
	case startCrash:
		o.counts.Restarted++
	case startFresh:
		o.counts.Created++
	}
	return nil
}

// collect takes back the operations that ended and folds their outcomes
// into the state and r.folded, at now. Only the owner calls it.
func (r *Reconciler) collect(now time.Time) {
	r.collectPulls(now)
	r.mu.Lock()
	done := r.done
	r.done = nil
	r.mu.Unlock()
	for _, o := range done {
		delete(r.ops, o.name)
		r.fold(o, now, &r.folded)
		r.unsaved = true
	}
}

// retry holds an instance whose last operation failed: no new operation is
// started for it before at (its restart backoff aside, for a start). The
// delay doubles from minBackoff up to maxRetry with each failure in a row,
// so that a failing driver call is not repeated at every pass, each woken
// by the failure before.
type retry struct {
	at    time.Time
	delay time.Duration
}

// maxRetry caps the delay before a failed operation is tried again.
const maxRetry = 30 * time.Second

// fold records an ended operation's outcome in the state and res.
func (r *Reconciler) fold(o *operation, now time.Time, res *Result) {
	res.Created += o.counts.Created
	res.Restarted += o.counts.Restarted
	res.Replaced += o.counts.Replaced
	res.Stopped += o.counts.Stopped
	res.Removed += o.counts.Removed
	st := r.state.Instances[o.name]
	if o.stopped && st != nil {
		st.PID, st.StartTime, st.State = 0, 0, report.StateStopped
	}
	if o.err == nil {
		delete(r.held, o.name)
		switch {
		case o.why == whyRelease:
			delete(r.state.Instances, o.name)
			r.log.Info("removed instance", "instance", o.name, "reason", o.reason)
		case o.why == whyApply && st != nil:
			liveSpec(&st.Spec, o.spec.Spec)
			st.SpecHash = o.spec.SpecHash
			st.Error = ""
		case o.why == whyUnwell && st != nil:
			// As a crash: the restart backoff, then a start (ensure).
			delete(r.unwell, o.name)
			st.LastExit = &ExitRecord{Code: -1, Known: true, At: now}
			if !st.Started.IsZero() && now.Sub(st.Started) >= resetAfter {
				st.Backoff = 0
			}
			st.Backoff = nextBackoff(st.Backoff)
			st.NextRestart = now.Add(st.Backoff)
			st.State = report.StateCrashLoop
			if !restartable(st.Spec.RestartPolicy, Exit{Code: -1, Known: true, At: now}) {
				st.State = report.StateFailed
			}
			st.Error = o.reason
			r.log.Info("instance stopped: a check failed", "instance", o.name, "why", o.reason, "restartIn", st.Backoff)
		case o.started:
			prev := st
			if prev == nil {
				prev = &InstanceState{}
			}
			restarts := prev.Restarts
			if o.kind == startCrash {
				restarts++
			}
			r.state.Instances[o.name] = &InstanceState{
				Service: o.spec.Service, Address: o.spec.Address.String(), SpecHash: o.spec.SpecHash, Spec: o.spec.Spec,
				PID: o.proc.PID, StartTime: o.proc.StartTime, Started: now, State: report.StateRunning,
				Restarts: restarts, Backoff: prev.Backoff, LastExit: prev.LastExit, Generation: o.gen,
				SpecSince: specSince(prev, o.spec.SpecHash, now), ProvenHash: prev.ProvenHash,
			}
			r.log.Info("started instance", "instance", o.name, "pid", o.proc.PID, "address", o.spec.Address, "specHash", short(o.spec.SpecHash))
		}
		return
	}
	if o.startFailed && errors.Is(o.err, oci.ErrArtifactCache) {
		// A cached artifact vanished or changed since it was fetched:
		// fetched again (and checked) before the next start.
		for _, a := range o.spec.Artifacts {
			delete(r.images, artifactKey(a.SHA256))
		}
	}
	if o.startFailed {
		if st == nil {
			st = &InstanceState{}
			r.state.Instances[o.name] = st
		}
		// It failed to start under this spec: the spec is recorded, so
		// that its backoff holds until the spec changes (a fresh
		// instance had no spec hash to compare with, and was retried at
		// every pass).
		st.SpecSince = specSince(st, o.spec.SpecHash, now)
		st.Service, st.Address, st.SpecHash, st.Spec, st.Generation = o.spec.Service, o.spec.Address.String(), o.spec.SpecHash, o.spec.Spec, o.gen
		st.State = report.StateCrashLoop
		st.Backoff = nextBackoff(st.Backoff)
		st.NextRestart = now.Add(st.Backoff)
	}
	res.Errors[o.name] = o.err
	if st != nil {
		st.Error = o.err.Error()
	}
	h := r.held[o.name]
	h.delay = min(max(2*h.delay, minBackoff), maxRetry)
	h.at = now.Add(h.delay)
	r.held[o.name] = h
	r.log.Warn("instance", "instance", o.name, "err", o.err, "retryIn", h.delay)
}

// specSince is when an instance whose state was prev runs at hash since:
// prev's time when it was at that hash already, now otherwise.
func specSince(prev *InstanceState, hash string, now time.Time) time.Time {
	if prev.SpecHash == hash && !prev.SpecSince.IsZero() {
		return prev.SpecSince
	}
	return now
}

// Close cancels the operations in flight, waits for them, folds what they
// did into the state and saves it, so that the next run finds every
// instance an operation touched (and adopts or removes it). Only the owner
// calls it; no goroutine of the Reconciler runs after it returns, and Pass
// then fails with ErrClosed.
func (r *Reconciler) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.cancel()
	r.wg.Wait()
	r.collect(r.cfg.Now())
	if !r.unsaved {
		return nil
	}
	return r.save()
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
