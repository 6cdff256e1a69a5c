// Package process is the Linux driver that runs each instance as an
// ordinary child process instead of a jail, so that the agent, `keel demo`
// and the end-to-end tests run without root.
//
// Every instance is a process-group leader started in its own directory,
// with its output appended to log files; volumes are directories; service
// and instance addresses are taken from 127.0.0.0/8, which Linux answers
// without configuration. Nothing is isolated or limited: this driver is for
// development and tests, never for untrusted workloads.
//
// The driver finds its instances from /proc, not from files of its own, so
// that an agent restarted after a crash adopts what the previous run
// started: each instance carries KEEL_DRIVER_ROOT (the state directory) and
// KEEL_SPEC_HASH in its environment. A process is identified by its PID and
// its start time, never by the PID alone. The package must not configure
// the network, change limits or need privileges.
//
// Layout of the state directory:
//
//	images/<image>/              optional: copied into an instance's root when it is first created
//	instances/<name>/root/       the instance's working directory and HOME
//	instances/<name>/stdout.log  its standard output, appended, capped by Running
//	instances/<name>/stderr.log  its standard error, likewise
//	volumes/<name>/              a volume (mode 0700)
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// DefaultLogMax is the size at which an instance's log is cut in half.
const DefaultLogMax = 10 << 20

// Options configure a Driver.
type Options struct {
	// StateDir holds images, instances and volumes. Required; created
	// if missing, made absolute and resolved through symbolic links.
	StateDir string
	// Logger receives the driver's warnings; nil discards them.
	Logger *slog.Logger
	// LogMax caps each of an instance's two logs, in bytes; 0 means
	// DefaultLogMax.
	LogMax int64
	// Capacity, when set, replaces what Capacity detects.
	Capacity *render.Resources
	// Now is the clock for Exit.At; nil means time.Now.
	Now func() time.Time
}

// Driver runs instances as process groups. It is safe for concurrent use.
type Driver struct {
	root     string
	log      *slog.Logger
	logMax   int64
	capacity *render.Resources
	now      func() time.Time
	bootTime time.Time

	// names serialises Start, Stop, Destroy and DeleteVolume per name.
	names nodeexec.KeyedMutex

	// scanMu guards cache, the /proc scan's memory of which processes are
	// instances (so that each environ is read once per process).
	scanMu gosync.Mutex
	cache  map[procKey]procInfo
	// environReads counts reads of /proc/<pid>/environ, for tests.
	environReads atomic.Int64
	// readEnviron reads /proc/<pid>/environ (a test may stand in).
	readEnviron func(pid int) ([]byte, error)

	mu gosync.Mutex
	// children are the instances this Driver started and has not yet
	// reaped, by instance name.
	children map[string]*child
	// adopted are instances seen running that an earlier agent started.
	adopted map[string]nodeexec.Process
	exits   map[string]nodeexec.Exit
	env     map[string][]string // environment of each instance's last Start
	vips    []netip.Addr
	routes  []nodeexec.Route
}

var _ nodeexec.Driver = (*Driver)(nil)

// New returns a driver over opts.StateDir, creating its directories. It
// starts nothing and reads no instance state: Running finds what runs.
func New(opts Options) (*Driver, error) {
	if opts.StateDir == "" {
		return nil, errors.New("process driver: a state directory is required")
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	// One spelling of the directory, whatever the agent was given: it is
	// how instances are recognised after a restart.
	root, err := filepath.Abs(opts.StateDir)
	if err == nil {
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, fmt.Errorf("process driver needs Linux's /proc: %w", err)
	}
	boot, err := parseBootTime(b)
	if err != nil {
		return nil, fmt.Errorf("process driver: /proc/%w", err)
	}
	for _, dir := range []string{"instances", "volumes"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			return nil, fmt.Errorf("process driver: %w", err)
		}
	}
	d := &Driver{
		root:     root,
		log:      opts.Logger,
		logMax:   opts.LogMax,
		capacity: opts.Capacity,
		now:      opts.Now,
		bootTime: boot,
		cache:    map[procKey]procInfo{},
		readEnviron: func(pid int) ([]byte, error) {
			return os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		},
		children: map[string]*child{},
		adopted:  map[string]nodeexec.Process{},
		exits:    map[string]nodeexec.Exit{},
		env:      map[string][]string{},
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if err := d.sweepImages(); err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	if d.logMax <= 0 {
		d.logMax = DefaultLogMax
	}
	if d.now == nil {
		d.now = time.Now
	}
	if err := d.removeDeleted(); err != nil {
		return nil, err
	}
	return d, nil
}

// Name implements nodeexec.Driver.
func (d *Driver) Name() string { return "process" }

// StateDir returns the absolute state directory.
func (d *Driver) StateDir() string { return d.root }

// RootDir returns the working directory of the named instance (which may
// not exist yet).
func (d *Driver) RootDir(name string) (string, error) {
	if err := checkName("instance", name); err != nil {
		return "", err
	}
	return filepath.Join(d.instanceDir(name), "root"), nil
}

// Capacity reports runtime.NumCPU() cores and the machine's MemTotal, or
// Options.Capacity when set. Instances on this driver share the machine
// with everything else on it; nothing is reserved.
func (d *Driver) Capacity(ctx context.Context) (render.Resources, error) {
	if d.capacity != nil {
		return *d.capacity, nil
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return render.Resources{}, fmt.Errorf("capacity: %w", err)
	}
	mem, err := parseMemTotal(b)
	if err != nil {
		return render.Resources{}, fmt.Errorf("capacity: /proc/%w", err)
	}
	return render.Resources{CPU: render.CPU(runtime.NumCPU() * 1000), Memory: render.Bytes(mem)}, nil
}

// Apply limits nothing: this driver has no resource controls, so instances
// may use more than their spec reserves. It returns nil for any instance.
func (d *Driver) Apply(ctx context.Context, name string, r render.Resources) error {
	return checkName("instance", name)
}

// loopback is where this driver's addresses live: Linux answers on all of
// 127.0.0.0/8 without any configuration.
var loopback = netip.MustParsePrefix("127.0.0.0/8")

// SetVIPs checks that every VIP is a loopback address and records them:
// there is nothing to configure, since Linux already answers on all of
// 127.0.0.0/8 (the service proxies bind the VIPs themselves).
func (d *Driver) SetVIPs(ctx context.Context, vips []netip.Addr) error {
	for _, a := range vips {
		if !a.IsValid() || !loopback.Contains(a) {
			return fmt.Errorf("VIP %s: the process driver serves VIPs from %s only; give the cluster a serviceCIDR inside it", a, loopback)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.vips = slices.Clone(vips)
	return nil
}

// SetRoutes checks that every route leads to a loopback subnet and records
// them: every node of a process-driver cluster shares the machine's
// loopback, so there is nothing to route.
func (d *Driver) SetRoutes(ctx context.Context, routes []nodeexec.Route) error {
	for _, r := range routes {
		if !r.Dest.IsValid() || !r.Via.IsValid() {
			return fmt.Errorf("route %s via %s: not a valid route", r.Dest, r.Via)
		}
		if !loopback.Contains(r.Dest.Addr()) || r.Dest.Bits() < loopback.Bits() {
			return fmt.Errorf("route %s: the process driver's subnets are inside %s; give the cluster a podCIDR inside it", r.Dest, loopback)
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

func (d *Driver) instanceDir(name string) string {
	return filepath.Join(d.root, "instances", name)
}

func (d *Driver) volumeDir(name string) string {
	return filepath.Join(d.root, "volumes", name)
}

// dnsLabel is render's rule for names; it keeps '/', '.', ".." and NUL out
// of every path built from a name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkName refuses a name that could escape its directory. Names are
// validated by render already; this is the last line before a path.
func checkName(kind, name string) error {
	if len(name) > render.MaxNameLength || !dnsLabel.MatchString(name) {
		return fmt.Errorf("%s name %q is not a DNS label; refusing to use it in a path", kind, name)
	}
	return nil
}

// imageSegment is render's rule for the parts of an image name.
var imageSegment = regexp.MustCompile(`^[a-z0-9][-a-z0-9._]*$`)

// imageDir returns where the named image lives, refusing any name that
// could climb out of images/.
func (d *Driver) imageDir(image string) (string, error) {
	for seg := range strings.SplitSeq(image, "/") {
		if !imageSegment.MatchString(seg) || seg == "." || seg == ".." {
			return "", fmt.Errorf("image %q: each part must be lowercase letters, digits, '-', '_' and '.'; refusing to use it in a path", image)
		}
	}
	return filepath.Join(d.root, "images", filepath.FromSlash(image)), nil
}
