// Package nodeexec makes a node match its share of the plan: the reconciler
// and its crash-safe state, written against small Driver interfaces that the
// process, fake and freebsd drivers implement, plus the data plane (service
// proxies). It is the only place, with sync and providers, that changes the
// machine it runs on.
package nodeexec

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
)

// InstanceSpec is everything a driver needs to run one instance.
type InstanceSpec struct {
	Name    string
	Service string // empty for a Jail
	Node    string
	Address netip.Addr
	Spec    render.JailSpec
	// SpecHash is recorded with the running instance, so that a restarted
	// agent knows which spec a process it adopts was started with.
	SpecHash string
	// Volumes maps each volume name of Spec.Volumes to its path on the
	// host, as returned by EnsureVolume.
	Volumes map[string]string
	// Artifacts are Spec.Artifacts with their files in the cache: the
	// driver places them in the root (oci.PlaceArtifacts) each time it
	// starts the instance, before its command; MaxUnpacked bounds what
	// an archive extracts to (0: the default).
	Artifacts   []oci.CachedArtifact
	MaxUnpacked int64
}

// Process identifies a running instance so that an agent restarted at any
// moment recognises it: the PID (or JID) and its start time, never the
// number alone, since numbers are reused.
type Process struct {
	PID       int
	StartTime uint64 // opaque, driver-defined; compared for equality only
	SpecHash  string // the spec hash the instance was started with
	Started   time.Time
}

// Exit is how an instance's process ended.
type Exit struct {
	// Code is the exit code; -1 when the process was killed by a signal
	// or when it was adopted and its status cannot be known.
	Code int
	// Known is false when the driver did not see the exit itself (the
	// process was started by an earlier agent run).
	Known bool
	At    time.Time
}

// Failed reports whether the exit counts as a failure for OnFailure.
func (e Exit) Failed() bool { return !e.Known || e.Code != 0 }

// ErrNotFound is returned for an instance or volume the driver does not hold.
var ErrNotFound = errors.New("not found")

// ErrBusy is returned when deleting a volume that a running instance mounts.
var ErrBusy = errors.New("in use")

// Instances runs jails (or their stand-ins). Implementations are safe for
// concurrent use. The reconciler calls Running and Exited from its owner's
// goroutine, and the operations on instances (Start, Stop, Destroy, Apply,
// with EnsureVolume) from goroutines of its own, one per instance at a
// time: calls for different instances overlap each other and Running,
// never two for the same instance (drivertest checks the overlap).
type Instances interface {
	// Running lists the instances that run now, found from the system
	// itself (jls, /proc) and not from any file of the agent's, so that
	// nothing started before a crash is missed.
	Running(ctx context.Context) (map[string]Process, error)
	// Exited returns how the named instance's last process ended, when it
	// ended since the driver started; ok is false otherwise.
	Exited(name string) (Exit, bool)
	// Start creates the instance's root (or jail) when missing and starts its
	// command. It returns ErrAlreadyRunning, with the process, if the
	// instance already runs: a driver never starts a second copy.
	Start(ctx context.Context, spec InstanceSpec) (Process, error)
	// Stop asks the instance's command to stop (SIGTERM or jail -r), waits
	// up to grace, then kills it, and returns once it is gone. Stopping an
	// instance that does not run is not an error.
	Stop(ctx context.Context, name string, grace time.Duration) error
	// Destroy removes the instance's root (never its volumes). It must not
	// run. Destroying an instance that does not exist is not an error.
	Destroy(ctx context.Context, name string) error
	// Apply applies resource limits to a running instance (rctl) without a
	// restart.
	Apply(ctx context.Context, name string, r render.Resources) error
	// Logs returns the tail of the instance's output, at most max bytes.
	Logs(name string, max int) ([]byte, error)
}

// ErrWaiting is returned (wrapped) for a stateful instance placed on this
// node that another node's report still lists as not stopped: it is not
// started until that report says otherwise (break before make). It is a
// condition to wait for, not a failure.
var ErrWaiting = errors.New("waiting")

// ErrAlreadyRunning is returned by Start when the instance already runs.
var ErrAlreadyRunning = errors.New("already running")

// Volumes holds persistent data that outlives instances.
type Volumes interface {
	// EnsureVolume creates the volume when missing and returns its path on
	// the host. size 0 means no quota.
	EnsureVolume(ctx context.Context, name string, size render.Bytes) (string, error)
	// Volumes lists the volumes that exist.
	Volumes(ctx context.Context) ([]string, error)
	// DeleteVolume destroys a volume and its data for good.
	DeleteVolume(ctx context.Context, name string) error
}

// Network attaches addresses and routes.
type Network interface {
	// SetVIPs makes the node answer on exactly these service addresses
	// (adding and removing aliases as needed).
	SetVIPs(ctx context.Context, vips []netip.Addr) error
	// SetRoutes installs exactly these routes to other nodes' subnets.
	SetRoutes(ctx context.Context, routes []Route) error
}

// Route sends a subnet to a gateway.
type Route struct {
	Dest netip.Prefix
	Via  netip.Addr
}

// Driver is everything a node needs.
type Driver interface {
	Instances
	Volumes
	Network
	// Capacity is what the node can give to instances.
	Capacity(ctx context.Context) (render.Resources, error)
	// Name identifies the driver in logs and reports ("process", "fake").
	Name() string
}

// Redirector is a driver that can send TCP connections to a port of the
// node's public interface to a listener of the agent's: the ingress's
// listeners behind ports 80 and 443 (pf on FreeBSD). SetRedirects replaces
// every redirect it set before; none removes them all.
type Redirector interface {
	SetRedirects(ctx context.Context, redirects []Redirect) error
}

// Redirect sends TCP connections to Port of the node's public interface's
// own addresses to To.
type Redirect struct {
	// Port is the public port: 80 or 443 for the ingress.
	Port uint16
	// To is where connections go: an address of the node and a port.
	To netip.AddrPort
}

// Execer is a driver that can run a command inside a running instance:
// the exec health checks (package probe). Exec is safe for concurrent use,
// with itself and with every other operation, on any instance.
type Execer interface {
	// Exec runs argv inside the named instance while it runs, as its
	// command runs (its environment, its root; argv is expanded and looked
	// up as the command is), and returns its exit status and the first
	// maxOutput bytes of its output, stdout and stderr together (the rest
	// is read and dropped). A non-zero exit is a code, not an error: err
	// is only for a command that could not be run, because the instance
	// does not run (wrapping ErrNotFound) or its program does not exist,
	// or because ctx ended. When ctx ends, the command and everything it
	// started are killed before Exec returns.
	Exec(ctx context.Context, name string, argv []string, maxOutput int) (code int, output []byte, err error)
}

// ImageStore is a driver that runs instances from OCI images (spec.image
// oci://…): it keeps each image unpacked once, by digest, read-only, and
// makes instance roots from it (hard links on the process driver, ZFS
// clones on FreeBSD). The reconciler pulls an image's layers (package
// oci) and adds it before it starts an instance from it. Implementations
// are safe for concurrent use; AddImage of one digest is never called
// twice at once.
type ImageStore interface {
	// HasImage reports whether the image of digest (sha256:<hex>, the
	// one the spec names) is unpacked and ready for Start.
	HasImage(ctx context.Context, digest string) (bool, error)
	// AddImage unpacks img, whose layers are in the puller's cache, as
	// its digest's image, at most maxUnpacked bytes of files; an image
	// cut short (a crash, an error) is never taken for a whole one.
	AddImage(ctx context.Context, img *oci.Image, maxUnpacked int64) error
	// Images lists the images unpacked.
	Images(ctx context.Context) ([]ImageInfo, error)
	// RemoveImage removes an unpacked image. Roots made from it before
	// are not changed: a driver whose roots depend on the image (ZFS
	// clones of its snapshot on FreeBSD) refuses while one exists, with
	// an error wrapping ErrBusy. An image not there is no error.
	RemoveImage(ctx context.Context, digest string) error
}

// ImageInfo is an unpacked image.
type ImageInfo struct {
	// Digest is the digest the spec names; Manifest the manifest's (they
	// differ when Digest names an index).
	Digest   string    `json:"digest"`
	Manifest string    `json:"manifest"`
	Size     int64     `json:"size"`     // its layers, compressed
	Unpacked int64     `json:"unpacked"` // bytes of its files
	Added    time.Time `json:"added"`
	// Layers are its layers' digests (in the puller's cache while an
	// image that has them is kept).
	Layers []string `json:"layers,omitempty"`
}
