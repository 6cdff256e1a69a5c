package freebsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	gosync "sync"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// Defaults of Options.
const (
	DefaultPool   = "zroot"
	DefaultBridge = "keel0"
	// DefaultLogMax is the size at which an instance's log is cut in half.
	DefaultLogMax = 10 << 20
)

// Options configure a Driver.
type Options struct {
	// Runner runs FreeBSD's commands: ExecRunner on a host, the simulator
	// in tests. Required.
	Runner Runner
	// Root is where the FreeBSD file system the commands see is rooted,
	// for what the driver does to it itself (the directories it creates
	// inside a jail's root, the pf rules file): "" or "/" on a host, the
	// simulator's root in tests. Command lines always carry FreeBSD paths.
	Root string
	// StateDir holds the driver's records and the instances' logs (on the
	// agent's own file system, never under Root). Required.
	StateDir string
	// Pool is the ZFS pool under whose keel/ dataset everything lives;
	// DefaultPool when empty.
	Pool string
	// Bridge is the node's bridge, for VIPs and for jails whose spec names
	// none; DefaultBridge when empty. It must be keel<N>.
	Bridge string
	// PublicIface is the interface whose ports 80 and 443 SetRedirects
	// sends to the ingress listeners; empty: SetRedirects refuses.
	PublicIface string
	// Logger receives the driver's warnings; nil discards them.
	Logger *slog.Logger
	// LogMax caps each of an instance's two logs, in bytes; 0 means
	// DefaultLogMax.
	LogMax int64
	// Now is the clock for exits; nil means time.Now.
	Now func() time.Time
}

// Driver runs instances as jails. It is safe for concurrent use: the work
// on one instance (or volume) is serialised, different ones run in
// parallel.
type Driver struct {
	runner   Runner
	root     string
	state    string
	pool     string
	bridge   string
	pubIface string
	log      *slog.Logger
	logMax   int64
	now      func() time.Time
	// loc is the zone ps prints start times in: the host's, as for the
	// agent.
	loc *time.Location

	// names serialises Start, Stop, Destroy and Apply per instance and
	// DeleteVolume per volume.
	names nodeexec.KeyedMutex

	// netMu guards net and serialises the node-wide network commands
	// (bridge, gateway and VIP aliases, routes, epair ordinals).
	netMu gosync.Mutex
	net   netRecord

	// pfMu guards pfLoaded, the rules last loaded into the anchor.
	pfMu     gosync.Mutex
	pfLoaded *string

	mu gosync.Mutex
	// records are the instances' records, as on disk.
	records map[string]*instanceRecord
	// children are the workloads this Driver started and has not yet
	// finished with, by instance.
	children map[string]*child
	// adopted are instances seen running that this Driver did not start.
	adopted map[string]nodeexec.Process
	exits   map[string]nodeexec.Exit
	// facts caches what cannot change while the host is up (capacity,
	// racct).
	facts facts
}

// facts are read once from sysctl: they change only with a reboot.
type facts struct {
	capacity *render.Resources
	racct    *bool
}

var _ nodeexec.Driver = (*Driver)(nil)

// ifaceName is what an interface name may be (IFNAMSIZ is 16, with NUL).
var ifaceName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.]{0,14}$`)

// New returns a driver. It reads its records under StateDir and, when the
// host rebooted since they were written (kern.boottime changed), forgets
// the aliases and routes they list, which the reboot removed. It creates
// nothing on the host.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Runner == nil {
		return nil, errors.New("freebsd driver: a Runner is required")
	}
	if opts.StateDir == "" {
		return nil, errors.New("freebsd driver: a state directory is required")
	}
	d := &Driver{
		runner:   opts.Runner,
		root:     opts.Root,
		pool:     opts.Pool,
		bridge:   opts.Bridge,
		pubIface: opts.PublicIface,
		log:      opts.Logger,
		logMax:   opts.LogMax,
		now:      opts.Now,
		loc:      time.Local,
		records:  map[string]*instanceRecord{},
		children: map[string]*child{},
		adopted:  map[string]nodeexec.Process{},
		exits:    map[string]nodeexec.Exit{},
	}
	if d.root == "" {
		d.root = "/"
	}
	if d.pool == "" {
		d.pool = DefaultPool
	}
	if d.bridge == "" {
		d.bridge = DefaultBridge
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.logMax <= 0 {
		d.logMax = DefaultLogMax
	}
	if d.now == nil {
		d.now = time.Now
	}
	if err := render.CheckPool(d.pool); err != nil {
		return nil, fmt.Errorf("freebsd driver: pool: %w", err)
	}
	if err := render.CheckBridge(d.bridge); err != nil {
		return nil, fmt.Errorf("freebsd driver: bridge: %w", err)
	}
	if d.pubIface != "" && (!ifaceName.MatchString(d.pubIface) || d.pubIface == d.bridge) {
		return nil, fmt.Errorf("freebsd driver: %q is not an interface name for the public interface", d.pubIface)
	}
	state, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("freebsd driver: %w", err)
	}
	d.state = filepath.Join(state, "freebsd")
	if err := os.MkdirAll(filepath.Join(d.state, "instances"), 0o700); err != nil {
		return nil, fmt.Errorf("freebsd driver: %w", err)
	}
	if err := d.loadRecords(); err != nil {
		return nil, fmt.Errorf("freebsd driver: %w", err)
	}
	if err := d.loadNet(ctx); err != nil {
		return nil, fmt.Errorf("freebsd driver: %w", err)
	}
	return d, nil
}

// Name implements nodeexec.Driver.
func (d *Driver) Name() string { return "freebsd" }

// Pool returns the ZFS pool.
func (d *Driver) Pool() string { return d.pool }

// jailName is the jail of an instance (docs/freebsd-notes.md §0).
func jailName(instance string) string { return "keel-" + instance }

// jailDataset is the dataset of an instance's root.
func (d *Driver) jailDataset(instance string) string {
	return d.pool + "/keel/jails/" + instance
}

// rootfs is an instance's root as FreeBSD sees it: the clone's default
// mountpoint, "/" + its dataset (docs/freebsd-notes.md §0; Check verifies
// that the pool is mounted that way).
func (d *Driver) rootfs(instance string) string { return "/" + d.jailDataset(instance) }

// imageDataset is the dataset of an image: base/x is <pool>/keel/base/x.
func (d *Driver) imageDataset(image string) string { return d.pool + "/keel/" + image }

// volumeDataset is the dataset of a volume.
func (d *Driver) volumeDataset(volume string) string { return d.pool + "/keel/volumes/" + volume }

// volumePath is a volume's path on the host, its default mountpoint.
func (d *Driver) volumePath(volume string) string { return "/" + d.volumeDataset(volume) }

// hostPath turns a FreeBSD path into one the agent can open: under Root.
func (d *Driver) hostPath(p string) string {
	return filepath.Join(d.root, filepath.FromSlash(path.Clean("/"+p)))
}

// instanceDir holds an instance's record and logs.
func (d *Driver) instanceDir(instance string) string {
	return filepath.Join(d.state, "instances", instance)
}

// checkName refuses a name that could escape its path, dataset or argv
// element: render's rule for names, the last line before one is used.
func checkName(kind, name string) error {
	if err := render.CheckName(name); err != nil {
		return fmt.Errorf("%s name: %w; refusing to use it", kind, err)
	}
	return nil
}
