// Package fake is an in-memory nodeexec.Driver for unit tests on any OS. It
// holds state and behaves like the process driver (the drivertest suite
// runs against both): fake PIDs and start times, one copy of an instance at
// most, exits, volumes that are busy while a running instance has them,
// VIPs and routes recorded. Controls make happen what a real system would
// do by itself: an instance crashing, a start failing, a command ignoring
// SIGTERM, an agent restarting; what an exec check finds inside an
// instance is a function the test sets (SetExec). It runs nothing, touches
// no file and never waits, except where a Hook makes an operation slow, as
// the commands of a real driver are; it counts the operations inside it at
// once, per instance and in all.
package fake

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"regexp"
	"slices"
	gosync "sync"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
)

// Root is the made-up state directory the fake's paths are under.
const Root = "/fake"

// Signals recorded by Stop.
const (
	SIGTERM = "TERM"
	SIGKILL = "KILL"
)

// Driver is the fake driver. It is safe for concurrent use.
type Driver struct {
	mu        gosync.Mutex
	now       func() time.Time
	nextPID   int
	ticks     uint64
	instances map[string]*instance // created and not destroyed
	exits     map[string]nodeexec.Exit
	volumes   map[string]bool
	failNext  map[string]error
	vips      []netip.Addr
	routes    []nodeexec.Route
	capacity  render.Resources
	problems  []nodeexec.HostProblem
	checkErr  error
	checks    int
	programs  map[string]ExecFunc // by instance (SetExec)
	execs     map[string]int      // commands Exec ran, by instance
	lastExec  map[string][]string
	images    map[string]nodeexec.ImageInfo // OCI images added, by digest
	imageAdds int
	// busyImages are the images RemoveImage refuses (SetImageBusy).
	busyImages map[string]bool

	hook     Hook
	busy     int            // operations inside the driver now
	maxBusy  int            // the most there ever were at once
	active   map[string]int // instance operations inside the driver now, by instance
	overlaps []string       // instances that had two operations inside at once
}

// Op names an operation of the driver, for a Hook.
type Op string

// The operations a Hook sees. Start, Stop, Destroy and Apply are
// operations on an instance; EnsureVolume and DeleteVolume on a volume.
const (
	OpStart        Op = "start"
	OpStop         Op = "stop"
	OpDestroy      Op = "destroy"
	OpApply        Op = "apply"
	OpEnsureVolume Op = "ensure-volume"
	OpDeleteVolume Op = "delete-volume"
)

// Hook is called at the beginning of each operation, with the operation's
// context, before the operation checks or changes anything and without
// the driver's lock: it stands for the time a real driver spends running
// commands. It may block (it should return when ctx ends) and may fail the
// operation, which then changes nothing and returns the hook's error.
type Hook func(ctx context.Context, op Op, name string) error

// instance is an instance's root, and its process when running.
type instance struct {
	running    bool
	proc       nodeexec.Process
	adopted    bool // started before the last AgentRestart
	volumes    []string
	env        []string
	procEnv    []string // env of the last Start, kept across AgentRestart
	ignoreTerm bool
	signals    []string
	starts     int
	applied    *render.Resources
	logs       []byte
	artifacts  map[string]string // placed at the last start: sha256 by path
}

var (
	_ nodeexec.Driver      = (*Driver)(nil)
	_ nodeexec.HostChecker = (*Driver)(nil)
)

// New returns an empty fake node with 4 cores and 8 GiB, on the real clock.
func New() *Driver {
	return &Driver{
		now:       time.Now,
		nextPID:   1000,
		instances: map[string]*instance{},
		exits:     map[string]nodeexec.Exit{},
		volumes:   map[string]bool{},
		failNext:  map[string]error{},
		capacity:  render.Resources{CPU: 4000, Memory: 8 << 30},
		active:    map[string]int{},
		programs:  map[string]ExecFunc{},
		execs:     map[string]int{},
		lastExec:  map[string][]string{},
		images:    map[string]nodeexec.ImageInfo{},
	}
}

// SetHook sets the hook called at the beginning of every operation (nil
// for none).
func (d *Driver) SetHook(h Hook) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = h
}

// Busy returns how many operations are inside the driver now (in their
// hook or past it), and the most there ever were at once.
func (d *Driver) Busy() (now, most int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.busy, d.maxBusy
}

// Overlaps returns the instances on which two operations (Start, Stop,
// Destroy, Apply) were inside the driver at once, once per overlap, in
// order.
func (d *Driver) Overlaps() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.overlaps)
}

// begin counts an operation in, runs the hook, and returns what counts it
// out; on the hook's error the operation is already counted out.
func (d *Driver) begin(ctx context.Context, op Op, name string) (end func(), err error) {
	instanceOp := op != OpEnsureVolume && op != OpDeleteVolume
	d.mu.Lock()
	d.busy++
	d.maxBusy = max(d.maxBusy, d.busy)
	if instanceOp {
		if d.active[name] > 0 {
			d.overlaps = append(d.overlaps, name)
		}
		d.active[name]++
	}
	hook := d.hook
	d.mu.Unlock()
	end = func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.busy--
		if instanceOp {
			if d.active[name]--; d.active[name] == 0 {
				delete(d.active, name)
			}
		}
	}
	if hook != nil {
		if err := hook(ctx, op, name); err != nil {
			end()
			return nil, fmt.Errorf("%s %s: %w", op, name, err)
		}
	}
	return end, nil
}

// Name implements nodeexec.Driver.
func (d *Driver) Name() string { return "fake" }

// SetClock sets the clock that dates starts and exits.
func (d *Driver) SetClock(now func() time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.now = now
}

// SetCapacity sets what Capacity reports.
func (d *Driver) SetCapacity(r render.Resources) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.capacity = r
}

// Capacity implements nodeexec.Driver.
func (d *Driver) Capacity(ctx context.Context) (render.Resources, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capacity, nil
}

// SetProblems sets the host problems Check finds from now on, as if the
// host had changed. With a "racct" problem the fake node cannot enforce
// resource limits, as the freebsd driver without kern.racct.enable: Start
// and Apply refuse limits with nodeexec.ErrLimitsUnenforced.
func (d *Driver) SetProblems(ps []nodeexec.HostProblem) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.problems = slices.Clone(ps)
}

// FailChecks makes Check fail with err (nil: work again), as when the
// commands it runs cannot run.
func (d *Driver) FailChecks(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checkErr = err
}

// Checks returns how many times Check was called.
func (d *Driver) Checks() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checks
}

// Check implements nodeexec.HostChecker: the problems of SetProblems.
func (d *Driver) Check(ctx context.Context) ([]nodeexec.HostProblem, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checks++
	if d.checkErr != nil {
		return nil, fmt.Errorf("host checks: %w", d.checkErr)
	}
	return slices.Clone(d.problems), nil
}

// limitsLocked refuses limits when a racct problem is set.
func (d *Driver) limitsLocked(r render.Resources) error {
	if r == (render.Resources{}) {
		return nil
	}
	for _, p := range d.problems {
		if p.Check == "racct" {
			return fmt.Errorf("%w: %s", nodeexec.ErrLimitsUnenforced, p.Problem)
		}
	}
	return nil
}

// Crash makes the running instance's process exit with code (-1 for a
// signal), as if it had ended by itself. For an instance adopted across an
// AgentRestart, the exit is not known (Known false, Code -1), as with the
// process driver.
func (d *Driver) Crash(name string, code int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.instances[name]
	if in == nil || !in.running {
		return fmt.Errorf("crash %s: not running: %w", name, nodeexec.ErrNotFound)
	}
	d.exitLocked(name, in, code)
	return nil
}

// exitLocked ends the instance's process.
func (d *Driver) exitLocked(name string, in *instance, code int) {
	e := nodeexec.Exit{Code: code, Known: true, At: d.now()}
	if in.adopted {
		e = nodeexec.Exit{Code: -1, Known: false, At: d.now()}
	}
	d.exits[name] = e
	in.running, in.adopted, in.ignoreTerm = false, false, false
}

// FailNextStart makes the next Start of the named instance return err
// without starting it.
func (d *Driver) FailNextStart(name string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failNext[name] = err
}

// IgnoreTerm makes the running instance ignore SIGTERM, as a command with
// a trap would: Stop then kills it, as it would after grace (the fake does
// not wait), and Signals shows both signals.
func (d *Driver) IgnoreTerm(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.instances[name]
	if in == nil || !in.running {
		return fmt.Errorf("ignore SIGTERM %s: not running: %w", name, nodeexec.ErrNotFound)
	}
	in.ignoreTerm = true
	return nil
}

// AgentRestart models the agent restarting over the same node, as a new
// process driver on the same state directory: instances keep running but
// are adopted (their exits are no longer known), past exits and computed
// environments are forgotten.
func (d *Driver) AgentRestart() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.exits)
	for _, in := range d.instances {
		in.env = nil
		if in.running {
			in.adopted = true
		}
	}
}

// WriteLog appends output to the instance's log, as its command would.
func (d *Driver) WriteLog(name string, b []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.instances[name]
	if in == nil {
		return fmt.Errorf("log %s: %w", name, nodeexec.ErrNotFound)
	}
	in.logs = append(in.logs, b...)
	return nil
}

// Signals returns the signals Stop sent to the instance since it was
// created, in order (SIGTERM, SIGKILL).
func (d *Driver) Signals(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil {
		return slices.Clone(in.signals)
	}
	return nil
}

// Starts returns how many times the instance was started since it was
// created.
func (d *Driver) Starts(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil {
		return in.starts
	}
	return 0
}

// Artifacts returns the artifacts placed in the instance's root at its
// last start: their sha256, by path.
func (d *Driver) Artifacts(name string) map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil {
		return maps.Clone(in.artifacts)
	}
	return nil
}

// checkArtifacts does what placing the spec's artifacts checks: each
// cached file is there and still matches its sha256, an archive's
// entries would be extracted.
func checkArtifacts(spec nodeexec.InstanceSpec) (map[string]string, error) {
	if len(spec.Artifacts) != len(spec.Spec.Artifacts) {
		return nil, fmt.Errorf("%d artifacts in the spec, %d cached", len(spec.Spec.Artifacts), len(spec.Artifacts))
	}
	out := map[string]string{}
	for _, a := range spec.Artifacts {
		if err := oci.CheckArtifact(context.Background(), a, spec.MaxUnpacked); err != nil {
			return nil, fmt.Errorf("artifact %s: %w", a.Path, err)
		}
		out[a.Path] = a.SHA256
	}
	return out, nil
}

// Applied returns the resources last applied to the instance.
func (d *Driver) Applied(name string) (render.Resources, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil && in.applied != nil {
		return *in.applied, true
	}
	return render.Resources{}, false
}

// Instances returns the names of the instances that exist (running or
// not), sorted.
func (d *Driver) Instances() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(maps.Keys(d.instances))
}

// Running implements nodeexec.Instances.
func (d *Driver) Running(ctx context.Context) (map[string]nodeexec.Process, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]nodeexec.Process{}
	for name, in := range d.instances {
		if in.running {
			out[name] = in.proc
		}
	}
	return out, nil
}

// Exited implements nodeexec.Instances.
func (d *Driver) Exited(name string) (nodeexec.Exit, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.exits[name]
	return e, ok
}

// Env returns the environment computed for the instance's last Start
// (since the last AgentRestart), sorted; the fake's state directory is
// Root.
func (d *Driver) Env(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil {
		return slices.Clone(in.env)
	}
	return nil
}

// Start implements nodeexec.Instances.
func (d *Driver) Start(ctx context.Context, spec nodeexec.InstanceSpec) (nodeexec.Process, error) {
	name := spec.Name
	if err := checkName("instance", name); err != nil {
		return nodeexec.Process{}, err
	}
	if len(spec.Spec.Command) == 0 {
		return nodeexec.Process{}, fmt.Errorf("start %s: no command", name)
	}
	end, err := d.begin(ctx, OpStart, name)
	if err != nil {
		return nodeexec.Process{}, err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil && in.running {
		return in.proc, fmt.Errorf("start %s: pid %d: %w", name, in.proc.PID, nodeexec.ErrAlreadyRunning)
	}
	if err, ok := d.failNext[name]; ok {
		delete(d.failNext, name)
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	if err := d.limitsLocked(spec.Spec.Resources); err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	if ref, err := render.ParseImage(spec.Spec.Image); err == nil && ref.IsOCI() {
		if _, ok := d.images[ref.Digest]; !ok {
			return nodeexec.Process{}, fmt.Errorf("start %s: image %s is not pulled on this node", name, spec.Spec.Image)
		}
	}
	for _, p := range spec.Volumes {
		if !d.volumes[path.Base(p)] || p != volumePath(path.Base(p)) {
			return nodeexec.Process{}, fmt.Errorf("start %s: volume %s is not a directory", name, p)
		}
	}
	env, err := instanceEnv(spec)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	placed, err := checkArtifacts(spec)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	in := d.instances[name]
	if in == nil {
		in = &instance{}
		d.instances[name] = in
	}
	d.nextPID++
	d.ticks++
	in.running, in.adopted, in.ignoreTerm = true, false, false
	in.proc = nodeexec.Process{PID: d.nextPID, StartTime: d.ticks, SpecHash: spec.SpecHash, Started: d.now()}
	in.volumes = slices.Collect(maps.Values(spec.Volumes))
	in.env, in.procEnv = env, env
	in.artifacts = placed
	in.starts++
	return in.proc, nil
}

// Stop implements nodeexec.Instances: the instance ends at once, killed by
// SIGTERM (Code -1), or by SIGKILL if it ignores SIGTERM.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	end, err := d.begin(ctx, OpStop, name)
	if err != nil {
		return err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.instances[name]
	if in == nil || !in.running {
		return nil
	}
	in.signals = append(in.signals, SIGTERM)
	if in.ignoreTerm {
		in.signals = append(in.signals, SIGKILL)
	}
	d.exitLocked(name, in, -1)
	return nil
}

// Destroy implements nodeexec.Instances.
func (d *Driver) Destroy(ctx context.Context, name string) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	end, err := d.begin(ctx, OpDestroy, name)
	if err != nil {
		return err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.instances[name]; in != nil && in.running {
		return fmt.Errorf("destroy %s: it runs (pid %d); stop it first: %w", name, in.proc.PID, nodeexec.ErrBusy)
	}
	delete(d.instances, name)
	return nil
}

// Apply records the resources (see Applied) and, like the process driver,
// limits nothing. With a racct problem set (SetProblems) it refuses
// limits.
func (d *Driver) Apply(ctx context.Context, name string, r render.Resources) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	end, err := d.begin(ctx, OpApply, name)
	if err != nil {
		return err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.limitsLocked(r); err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}
	if in := d.instances[name]; in != nil {
		in.applied = &r
	}
	return nil
}

// Logs implements nodeexec.Instances: the tail of what WriteLog appended.
func (d *Driver) Logs(name string, limit int) ([]byte, error) {
	if err := checkName("instance", name); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.instances[name]
	if in == nil {
		return nil, fmt.Errorf("logs %s: %w", name, nodeexec.ErrNotFound)
	}
	b := in.logs
	if len(b) > limit {
		b = b[len(b)-max(limit, 0):]
	}
	return slices.Clone(b), nil
}

// EnsureVolume implements nodeexec.Volumes; the size is not enforced.
func (d *Driver) EnsureVolume(ctx context.Context, name string, size render.Bytes) (string, error) {
	if err := checkName("volume", name); err != nil {
		return "", err
	}
	end, err := d.begin(ctx, OpEnsureVolume, name)
	if err != nil {
		return "", err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.volumes[name] = true
	return volumePath(name), nil
}

// Volumes implements nodeexec.Volumes.
func (d *Driver) Volumes(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(maps.Keys(d.volumes)), nil
}

// DeleteVolume implements nodeexec.Volumes.
func (d *Driver) DeleteVolume(ctx context.Context, name string) error {
	if err := checkName("volume", name); err != nil {
		return err
	}
	end, err := d.begin(ctx, OpDeleteVolume, name)
	if err != nil {
		return err
	}
	defer end()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.volumes[name] {
		return fmt.Errorf("volume %s: %w", name, nodeexec.ErrNotFound)
	}
	for _, inst := range slices.Sorted(maps.Keys(d.instances)) {
		if in := d.instances[inst]; in.running && slices.Contains(in.volumes, volumePath(name)) {
			return fmt.Errorf("volume %s: instance %s runs with it: %w", name, inst, nodeexec.ErrBusy)
		}
	}
	delete(d.volumes, name)
	return nil
}

// SetVIPs implements nodeexec.Network; any valid address is accepted.
func (d *Driver) SetVIPs(ctx context.Context, vips []netip.Addr) error {
	for _, a := range vips {
		if !a.IsValid() {
			return fmt.Errorf("VIP %s: not a valid address", a)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.vips = slices.Clone(vips)
	return nil
}

// SetRoutes implements nodeexec.Network.
func (d *Driver) SetRoutes(ctx context.Context, routes []nodeexec.Route) error {
	for _, r := range routes {
		if !r.Dest.IsValid() || !r.Via.IsValid() {
			return fmt.Errorf("route %s via %s: not a valid route", r.Dest, r.Via)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.routes = slices.Clone(routes)
	return nil
}

// VIPs returns the VIPs last set.
func (d *Driver) VIPs() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.vips)
}

// Routes returns the routes last set.
func (d *Driver) Routes() []nodeexec.Route {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.routes)
}

func volumePath(name string) string { return Root + "/volumes/" + name }

// instanceEnv is the environment the process driver would give the
// instance, with Root as its state directory and no PATH.
func instanceEnv(spec nodeexec.InstanceSpec) ([]string, error) {
	env, err := nodeexec.InstanceEnv(spec, Root+"/instances/"+spec.Name+"/root", Root)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// dnsLabel is render's rule for names.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkName refuses what the process driver would refuse to put in a path.
func checkName(kind, name string) error {
	if len(name) > render.MaxNameLength || !dnsLabel.MatchString(name) {
		return fmt.Errorf("%s name %q is not a DNS label; refusing to use it in a path", kind, name)
	}
	return nil
}
