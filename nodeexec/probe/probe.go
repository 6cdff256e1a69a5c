// Package probe runs the health checks of the instances a node runs
// (startup, readiness and liveness checks of kind tcp, http or exec) and
// keeps, for each instance, whether it is ready and since when, its last
// failure, and whether a liveness (or startup) failure asks for a restart.
// It restarts nothing and reports nothing itself: its owner (the
// reconciler's) hands it the running instances with Set, reads Status, and
// is woken through Changes.
//
// Every check of a target runs on a goroutine of its own that sleeps
// between runs; at most Options.MaxConcurrent runs are in flight at once,
// all targets together, each bounded by its check's timeout. Set and
// Status only take a lock: they never wait for a run.
package probe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// Defaults for a check whose fields are zero (render fills them in; the
// prober does not rely on it), and for Options.
const (
	DefaultPeriod           = 5 * time.Second
	DefaultTimeout          = time.Second
	DefaultSuccessThreshold = 1
	DefaultFailureThreshold = 3
	DefaultMaxConcurrent    = 16
	// FirstInterval is when a check first runs, after its target was set;
	// until the check first passes, the interval doubles after each run,
	// up to the check's period.
	FirstInterval = 5 * time.Millisecond
	// StartPace caps that interval for a tcp or an http check during
	// StartWindow after its first run (StartPaceFast during its first
	// StartFastWindow while its connections are refused): an instance
	// that takes a moment to bind is seen ready within a few milliseconds
	// of it (the keel binary binds 35 ms after its start on an idle host,
	// well past the 5 ms and 15 ms runs of the doubling), not within as
	// long again as it took. A refused connection costs the host next to
	// nothing; once the port accepts, an application still warming up
	// (an http check failing) is asked every StartPace, not every
	// StartPaceFast. An exec check, a process per run, is not capped.
	StartPaceFast   = 10 * time.Millisecond
	StartFastWindow = time.Second
	StartPace       = 50 * time.Millisecond
	StartWindow     = 3 * time.Second
	// MaxFailure bounds Status.Failure, in bytes.
	MaxFailure = 512
)

// ErrClosed is returned by Set once the Prober is closed.
var ErrClosed = errors.New("probe: prober closed")

// Target is a running instance whose checks are to be run.
type Target struct {
	Name string
	// Address is where tcp and http checks connect.
	Address netip.Addr
	// Identity names the instance's process: when it changes (a new
	// process, say its PID, start time and spec hash), the target starts
	// again from scratch.
	Identity string
	Checks   render.Checks
}

// Status is what the checks of a target found.
type Status struct {
	// Ready: the startup check has passed (or there is none) and the
	// readiness check passes (or there is none), and no liveness failure
	// is pending.
	Ready bool
	// ReadySince is when Ready last became true (zero while it is not),
	// by Options.Now.
	ReadySince time.Time
	// StartupPassed: the startup check passed once, or there is none.
	StartupPassed bool
	// Failure is the last failure of a check that has not passed since
	// ("readiness: http GET /healthz: status 503"), empty when each
	// passes; at most MaxFailure bytes, never a response body.
	Failure string
	// LivenessFailed: the liveness check (or the startup check, before
	// it first passed) failed its FailureThreshold times in a row. The
	// owner should restart the instance; the target's checks have
	// stopped, and start again when its Identity changes.
	LivenessFailed bool
}

// Options configure a Prober. The zero value is usable.
type Options struct {
	// Exec runs exec checks; nil: they fail, saying so.
	Exec nodeexec.Execer
	// MaxConcurrent bounds the runs in flight at once; default
	// DefaultMaxConcurrent.
	MaxConcurrent int
	// Logger receives the changes of readiness and the liveness
	// failures; nil discards them.
	Logger *slog.Logger
	// Now dates ReadySince; nil means time.Now.
	Now func() time.Time
}

// Prober runs the checks of a set of targets. Its methods are safe for
// concurrent use.
type Prober struct {
	exec nodeexec.Execer
	log  *slog.Logger
	now  func() time.Time
	// mono is the clock that spaces the failures that count, and sleep
	// waits between runs; tests replace them.
	mono   func() time.Time
	sleep  func(ctx context.Context, d time.Duration) bool
	client *http.Client
	// slots holds one token per run in flight (MaxConcurrent).
	slots chan struct{}
	// changes has one slot: bursts of changes collapse into one wake.
	changes chan struct{}

	// ctx is cancelled by Close; every target's context derives from it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // guards targets, closed and every target's state
	targets map[string]*target
	closed  bool

	// wg counts every goroutine of the Prober: one per check of a target
	// that runs.
	wg sync.WaitGroup
}

// kind is one of a target's three checks.
type kind int

const (
	startup kind = iota
	readiness
	liveness
	kinds
)

func (k kind) String() string { return [...]string{"startup", "readiness", "liveness"}[k] }

// target is a Target being probed. Its checks' goroutines end when ctx
// does; the fields below it are guarded by Prober.mu.
type target struct {
	Target
	ctx    context.Context
	cancel context.CancelFunc

	startupPassed  bool
	ready          bool
	readySince     time.Time
	livenessFailed bool
	failure        [kinds]string // each check's last failure, "" once it passes
}

func (t *target) check(k kind) *render.Check {
	return [...]*render.Check{t.Checks.Startup, t.Checks.Readiness, t.Checks.Liveness}[k]
}

// New returns a Prober that probes nothing until Set is called.
func New(opts Options) *Prober {
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Prober{
		exec:    opts.Exec,
		log:     opts.Logger,
		now:     opts.Now,
		mono:    time.Now,
		sleep:   sleep,
		client:  newHTTPClient(),
		slots:   make(chan struct{}, opts.MaxConcurrent),
		changes: make(chan struct{}, 1),
		ctx:     ctx,
		cancel:  cancel,
		targets: map[string]*target{},
	}
}

// Set makes the Prober probe exactly targets: it starts on new ones,
// stops on those no longer listed, and starts again from scratch (not
// ready, startup not passed) on those whose Identity, Address or Checks
// changed. Others go on as they are. A target without any check is ready
// at once. The error lists the targets refused (no name, listed twice: the
// first is kept); the others are applied all the same.
func (p *Prober) Set(targets []Target) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	var errs []error
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		switch _, dup := want[t.Name]; {
		case t.Name == "":
			errs = append(errs, errors.New("a target without a name"))
		case dup:
			errs = append(errs, fmt.Errorf("target %q: listed twice; the first is used", t.Name))
		default:
			want[t.Name] = t
		}
	}
	// A target whose process is the same and whose checks changed (a live
	// change of its spec) keeps its readiness: its new checks take over
	// from there, rather than every replica of a Service turning unready
	// at once while they first run.
	carried := map[string]*target{}
	for name, tg := range p.targets {
		if t, ok := want[name]; !ok || !same(tg.Target, t) {
			tg.cancel()
			delete(p.targets, name)
			if ok && t.Identity == tg.Identity && t.Address == tg.Address && tg.startupPassed && !tg.livenessFailed {
				carried[name] = tg
			}
		}
	}
	for name, t := range want {
		if _, ok := p.targets[name]; !ok {
			p.startLocked(t, carried[name])
		}
	}
	return errors.Join(errs...)
}

// same reports whether a target's probing can go on as it is.
func same(a, b Target) bool {
	return a.Identity == b.Identity && a.Address == b.Address && reflect.DeepEqual(a.Checks, b.Checks)
}

// startLocked begins probing t: its startup check, or its readiness and
// liveness checks when it has none.
//
// A target carried over from one whose checks changed, its process the
// same, keeps its readiness, and its startup check is not run again.
func (p *Prober) startLocked(t Target, carried *target) {
	// The checks are the prober's own from now on: a caller's later
	// change of its model must not reach the goroutines reading them.
	t.Checks = render.Checks{Startup: cloneCheck(t.Checks.Startup), Readiness: cloneCheck(t.Checks.Readiness), Liveness: cloneCheck(t.Checks.Liveness)}
	ctx, cancel := context.WithCancel(p.ctx)
	tg := &target{Target: t, ctx: ctx, cancel: cancel}
	p.targets[t.Name] = tg
	if carried != nil {
		tg.ready, tg.readySince = carried.ready, carried.readySince
		p.startupPassedLocked(tg)
		return
	}
	if t.Checks.Startup != nil {
		p.goLocked(tg, startup)
		return
	}
	p.startupPassedLocked(tg)
}

func cloneCheck(c *render.Check) *render.Check {
	if c == nil {
		return nil
	}
	d := *c
	if c.TCP != nil {
		tcp := *c.TCP
		d.TCP = &tcp
	}
	if c.HTTP != nil {
		h := *c.HTTP
		d.HTTP = &h
	}
	if c.Exec != nil {
		d.Exec = &render.ExecCheck{Command: slices.Clone(c.Exec.Command)}
	}
	return &d
}

// startupPassedLocked starts the readiness and liveness checks, once the
// startup check passed or at once without one; without a readiness check
// the target is ready now.
func (p *Prober) startupPassedLocked(tg *target) {
	tg.startupPassed = true
	if tg.Checks.Readiness == nil {
		p.setReadyLocked(tg, true, "")
	} else {
		p.goLocked(tg, readiness)
	}
	if tg.Checks.Liveness != nil {
		p.goLocked(tg, liveness)
	}
}

func (p *Prober) goLocked(tg *target, k kind) {
	s := settingsOf(tg.check(k))
	p.wg.Go(func() { p.loop(tg, k, s) })
}

// Status returns what the checks of the named target found, and false
// when it is not a target.
func (p *Prober) Status(name string) (Status, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tg, ok := p.targets[name]
	if !ok {
		return Status{}, false
	}
	s := Status{
		Ready:          tg.ready,
		ReadySince:     tg.readySince,
		StartupPassed:  tg.startupPassed,
		LivenessFailed: tg.livenessFailed,
	}
	for k := range kinds {
		if tg.failure[k] != "" {
			s.Failure = tg.failure[k]
			break
		}
	}
	return s, true
}

// Changes is signalled when a target's Ready changes or its
// LivenessFailed becomes true. It has one slot: several changes before
// the owner reads it wake it once, and it then reads every Status it
// cares about.
func (p *Prober) Changes() <-chan struct{} { return p.changes }

func (p *Prober) signal() {
	select {
	case p.changes <- struct{}{}:
	default:
	}
}

// Close stops every check, killing the runs in flight (their contexts
// end), and returns once every goroutine of the Prober has ended. The
// Prober cannot be used again.
func (p *Prober) Close() {
	p.mu.Lock()
	p.closed = true
	p.targets = map[string]*target{}
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
	p.client.CloseIdleConnections()
}

// settings are a check's numbers, defaults applied to zero fields.
type settings struct {
	period, timeout  time.Duration
	success, failure int
}

func settingsOf(c *render.Check) settings {
	s := settings{
		period:  time.Duration(c.Period),
		timeout: time.Duration(c.Timeout),
		success: c.SuccessThreshold,
		failure: c.FailureThreshold,
	}
	if s.period <= 0 {
		s.period = DefaultPeriod
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.success <= 0 {
		s.success = DefaultSuccessThreshold
	}
	if s.failure <= 0 {
		s.failure = DefaultFailureThreshold
	}
	return s
}

// loop runs one check of a target until the target's context ends or
// the check has done its part (a startup check that passed, a liveness
// failure).
//
// Until the check first passes it runs FirstInterval after the target
// was set, then at twice the previous interval, up to its period (a tcp
// or http check at most startPace apart in its first seconds), so that an
// instance that is ready at once is seen ready within about
// FirstInterval; from then on it runs every period. A failure counts
// toward the failure threshold
// when it is the first since a pass, or when a period has gone by since
// the last one that counted: the fast runs find a pass sooner, never a
// failure sooner, so a check that never passes fails after about
// (threshold-1) periods, as if it had run every period.
func (p *Prober) loop(tg *target, k kind, s settings) {
	c := tg.check(k)
	var start time.Time // when the first run began
	var (
		delay, next = min(FirstInterval, s.period), min(2*FirstInterval, s.period)
		passedOnce  bool
		passes      int
		failures    int
		counted     time.Time // when the last failure that counted began
	)
	for {
		if !p.sleep(tg.ctx, delay) || !p.acquire(tg.ctx) {
			return
		}
		began := p.mono()
		if start.IsZero() {
			start = began
		}
		err := p.run(tg, c, s.timeout)
		<-p.slots
		if tg.ctx.Err() != nil {
			return
		}
		if err == nil {
			passes, failures, passedOnce = passes+1, 0, true
		} else {
			passes = 0
			if failures == 0 || began.Sub(counted) >= s.period {
				failures++
				counted = began
			}
		}
		if p.record(tg, k, s, err, passes, failures) {
			return
		}
		if passedOnce {
			delay = s.period
		} else {
			delay, next = next, min(2*next, s.period)
			if pace := startPace(c, began.Sub(start), errors.Is(err, syscall.ECONNREFUSED)); pace > 0 {
				delay, next = min(delay, pace), min(next, pace)
			}
		}
	}
}

// startPace is the longest interval between two runs of check c, which
// has not passed yet, elapsed after its first run, the last of which met
// a refused connection or not; 0 when uncapped.
func startPace(c *render.Check, elapsed time.Duration, refused bool) time.Duration {
	switch {
	case c.Exec != nil || elapsed >= StartWindow:
		return 0
	case refused && elapsed < StartFastWindow:
		return StartPaceFast
	}
	return StartPace
}

// sleep waits d, and reports false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// acquire takes a run's slot, and reports false when ctx ended first.
func (p *Prober) acquire(ctx context.Context) bool {
	select {
	case p.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// record applies the outcome of a run of check k to its target, and
// reports whether the check's loop is done.
func (p *Prober) record(tg *target, k kind, s settings, err error, passes, failures int) (done bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tg.ctx.Err() != nil || p.targets[tg.Name] != tg {
		return true
	}
	if err == nil {
		tg.failure[k] = ""
	} else {
		tg.failure[k] = bound(k.String() + ": " + err.Error())
	}
	switch {
	case k == startup && err == nil && passes >= s.success:
		p.startupPassedLocked(tg)
		return true
	case (k == startup || k == liveness) && err != nil && failures >= s.failure:
		tg.livenessFailed = true
		p.log.Warn("instance failed its "+k.String()+" check", "instance", tg.Name, "failures", failures, "err", tg.failure[k])
		if !tg.ready {
			p.signal()
		}
		p.setReadyLocked(tg, false, tg.failure[k])
		tg.cancel() // its other checks stop too: it is to be restarted
		return true
	case k == readiness && err == nil && passes >= s.success:
		p.setReadyLocked(tg, true, "")
	case k == readiness && err != nil && failures >= s.failure:
		p.setReadyLocked(tg, false, tg.failure[k])
	}
	return false
}

// setReadyLocked sets a target's readiness, signalling a change.
func (p *Prober) setReadyLocked(tg *target, ready bool, why string) {
	if tg.ready == ready {
		return
	}
	tg.ready = ready
	if ready {
		tg.readySince = p.now()
		p.log.Info("instance ready", "instance", tg.Name)
	} else {
		tg.readySince = time.Time{}
		p.log.Info("instance not ready", "instance", tg.Name, "err", why)
	}
	p.signal()
}
