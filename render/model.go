package render

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// Defaults of the Cluster document, as documented in docs/spec.md.
var (
	DefaultPodCIDR     = netip.MustParsePrefix("10.200.0.0/16")
	DefaultServiceCIDR = netip.MustParsePrefix("10.201.0.0/16")
)

const (
	DefaultBridge         = "keel0"
	DefaultPool           = "zroot"
	DefaultLivenessTTL    = Duration(30e9)
	DefaultReportInterval = Duration(10e9)
	// With gossip on, liveness comes from the ring: a report is pushed
	// when its content changes and otherwise once a heartbeat interval,
	// so that the repository alone still shows who is alive. See
	// GossipReportInterval.
	DefaultGossipLivenessTTL    = Duration(180e9)
	DefaultGossipReportInterval = Duration(60e9)
	DefaultReportRefPrefix      = "refs/keel/reports/"
	DefaultRestartPolicy        = "Always"
	DefaultCPU                  = CPU(1000)
	DefaultMemory               = Bytes(512 << 20)
	DefaultPath                 = "/"
	// DefaultMaxInstances is the cluster's instance cap when cluster.yaml
	// sets none, and MaxInstancesLimit the largest cap it may set.
	DefaultMaxInstances = 10000
	MaxInstancesLimit   = 100000
)

// CertRefPrefix is where the shared certificates are published
// (sync.CertRefPrefix); reportRefPrefix may not overlap it.
const CertRefPrefix = "refs/keel/certs/"

// DefaultCommand is what a jail runs when its spec names no command: the
// image's own init, as a FreeBSD jail started with exec.start does.
var DefaultCommand = []string{"/bin/sh", "/etc/rc"}

// Model is a rendered cluster repository: every default applied, every
// Service expanded into its replicas, every subnet and VIP allocated. Slices
// are sorted by name.
type Model struct {
	Cluster   Cluster    `json:"cluster" yaml:"cluster"`
	Nodes     []Node     `json:"nodes" yaml:"nodes"`
	Services  []Service  `json:"services" yaml:"services"`
	Instances []Instance `json:"instances" yaml:"instances"`
	Ingresses []Ingress  `json:"ingresses" yaml:"ingresses"`
	// Lock is keel.lock as read (empty when the repository has none).
	Lock Lock `json:"-" yaml:"-"`
	// Diagnostics holds the warnings (and, when rendering failed, the
	// errors) found while reading.
	Diagnostics Diagnostics `json:"-" yaml:"-"`
}

// GossipReportInterval is the default reportInterval of a cluster of n
// nodes with a gossip ring: 60 s, or 200 ms a node if that is longer
// (whole seconds), so that the cluster pushes at most five heartbeats a
// second in all, whatever its size (a heartbeat push is most of a git
// server's work at 1,000 nodes: docs/benchmarks.md). The default
// livenessTTL is three times it.
func GossipReportInterval(n int) Duration {
	return Duration(max(time.Duration(DefaultGossipReportInterval), (time.Duration(n) * 200 * time.Millisecond).Round(time.Second)))
}

// Cluster holds the cluster-wide settings with their defaults applied.
type Cluster struct {
	Name            string   `json:"name" yaml:"name"`
	PodCIDR         Prefix   `json:"podCIDR" yaml:"podCIDR"`
	ServiceCIDR     Prefix   `json:"serviceCIDR" yaml:"serviceCIDR"`
	Bridge          string   `json:"bridge" yaml:"bridge"`
	Pool            string   `json:"pool" yaml:"pool"`
	LivenessTTL     Duration `json:"livenessTTL" yaml:"livenessTTL"`
	ReportInterval  Duration `json:"reportInterval" yaml:"reportInterval"`
	ReportRefPrefix string   `json:"reportRefPrefix" yaml:"reportRefPrefix"`
	ReportRepo      string   `json:"reportRepo" yaml:"reportRepo"`
	Suspend         bool     `json:"suspend" yaml:"suspend"`
	AllowEmpty      bool     `json:"allowEmpty" yaml:"allowEmpty"`
	MinAgentVersion string   `json:"minAgentVersion" yaml:"minAgentVersion"`
	// MaxInstances caps the number of instances (Jails plus Service
	// replicas and surge instances) the repository may declare.
	MaxInstances int `json:"maxInstances" yaml:"maxInstances"`
	// Gossip, when set, turns the gossip ring on (docs/agent.md, "Gossip").
	Gossip *Gossip `json:"gossip,omitempty" yaml:"gossip,omitempty"`
}

// Gossip is the cluster's gossip ring.
type Gossip struct {
	// Port is the UDP and TCP port every agent listens on, at its node's
	// inventory address.
	Port int `json:"port" yaml:"port"`
}

// AllocationSource says where a node subnet or a VIP came from.
type AllocationSource string

const (
	SourceExplicit AllocationSource = "explicit" // written in the spec
	SourceLocked   AllocationSource = "locked"   // read from keel.lock
	SourceDerived  AllocationSource = "derived"  // computed; run keel lock to pin it
)

// Node is one member of the inventory.
type Node struct {
	Name          string            `json:"name" yaml:"name"`
	Labels        map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
	Address       Addr              `json:"address" yaml:"address"`
	PodCIDR       Prefix            `json:"podCIDR" yaml:"podCIDR"`
	PodCIDRSource AllocationSource  `json:"podCIDRSource" yaml:"podCIDRSource"`
	// Capacity overrides what the node's agent detects; nil when not set.
	Capacity    *Resources `json:"capacity,omitempty" yaml:"capacity,omitempty"`
	Schedulable bool       `json:"schedulable" yaml:"schedulable"`
	ReportKey   string     `json:"reportKey,omitempty" yaml:"reportKey,omitempty"`
	Source      Position   `json:"source" yaml:"source"`
}

// IngressLabel marks the nodes that serve Ingresses: with the value
// "true" on any node, only those serve them; on none, every node does.
const IngressLabel = "keel.dev/ingress"

// IngressNodes returns the nodes that serve Ingresses: those labelled
// IngressLabel=true, or every node when none is.
func (m *Model) IngressNodes() []Node {
	var out []Node
	for _, n := range m.Nodes {
		if n.Labels[IngressLabel] == "true" {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return slices.Clone(m.Nodes)
	}
	return out
}

// CanReceiveCertificates reports whether shared certificates can be
// encrypted to the node: age encrypts to ssh-ed25519 and ssh-rsa keys,
// not to ECDSA ones, nor to a node without a reportKey.
func (n Node) CanReceiveCertificates() bool {
	t, _, _ := strings.Cut(n.ReportKey, " ")
	return t == "ssh-ed25519" || t == "ssh-rsa"
}

// Service is a replicated workload behind a virtual IP.
type Service struct {
	Name      string           `json:"name" yaml:"name"`
	Port      int              `json:"port" yaml:"port"`
	Replicas  int              `json:"replicas" yaml:"replicas"`
	VIP       Addr             `json:"vip" yaml:"vip"`
	VIPSource AllocationSource `json:"vipSource" yaml:"vipSource"`
	// Instances are the replicas' names, in index order.
	Instances []string `json:"instances" yaml:"instances"`
	Stateful  bool     `json:"stateful" yaml:"stateful"`
	// Strategy paces the Service's rollouts, with its defaults applied.
	Strategy Strategy `json:"strategy" yaml:"strategy"`
	// Surge names the Service's surge instances (Strategy.MaxSurge of
	// them, indexes Replicas and up), which run only while a rollout is
	// under way; empty for a stateful Service.
	Surge  []string `json:"surge,omitempty" yaml:"surge,omitempty"`
	Source Position `json:"source" yaml:"source"`
}

// Strategy is how a Service's replicas are updated when their spec changes
// (docs/spec.md, "Rollouts"): every node paces the rollout from the same
// reports, so that at most MaxUnavailable replicas are unavailable and at
// most Replicas+MaxSurge run at once.
type Strategy struct {
	// MaxUnavailable is how many of the Service's replicas may be
	// unavailable (not ready for MinReadySeconds) at once during a
	// rollout; a percentage written in the spec is resolved against the
	// replicas, rounded down. Zero only with MaxSurge > 0.
	MaxUnavailable int `json:"maxUnavailable" yaml:"maxUnavailable"`
	// MaxSurge is how many surge instances may run at the new spec on
	// top of the replicas during a rollout (a percentage rounded up).
	MaxSurge int `json:"maxSurge" yaml:"maxSurge"`
	// MinReadySeconds is how long a replica must have been ready before
	// it counts as available.
	MinReadySeconds int `json:"minReadySeconds" yaml:"minReadySeconds"`
	// ProgressDeadline is how long a replica started at the new spec may
	// take to become ready before the rollout counts as failed.
	ProgressDeadline Duration `json:"progressDeadline,omitzero" yaml:"progressDeadline,omitempty"`
	// FailureAction is what a failed rollout does: FailurePause stops
	// releasing replicas, FailureContinue goes on.
	FailureAction string `json:"failureAction" yaml:"failureAction"`
}

// Failure actions of a Strategy.
const (
	FailurePause    = "pause"
	FailureContinue = "continue"
)

// Instance is one jail to run: a Jail document, or one replica of a Service.
type Instance struct {
	Name string `json:"name" yaml:"name"`
	// Service is the Service this instance is a replica of, empty for a Jail.
	Service string `json:"service,omitempty" yaml:"service,omitempty"`
	// Index is the replica's index within its Service (0 for a Jail).
	Index int `json:"index" yaml:"index"`
	// Node is the node the instance must run on, from spec.node or from the
	// subnet holding its explicit address; empty when the planner chooses.
	Node string `json:"node,omitempty" yaml:"node,omitempty"`
	// Pin is the node keel.lock pins a stateful instance to.
	Pin string `json:"pin,omitempty" yaml:"pin,omitempty"`
	// NodeSubnet is the /24 of the node the instance is bound to (by
	// spec.node, its address or its pin); empty when the planner chooses.
	NodeSubnet Prefix `json:"nodeSubnet,omitzero" yaml:"nodeSubnet,omitempty"`
	// VIP is the virtual IP of the instance's Service.
	VIP          Addr              `json:"vip,omitzero" yaml:"vip,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty" yaml:"nodeSelector,omitempty"`
	Spec         JailSpec          `json:"spec" yaml:"spec"`
	// Stateful is true when the instance has volumes.
	Stateful bool `json:"stateful" yaml:"stateful"`
	// Surge marks a Service's surge instance: the planner places it only
	// while the Service's rollout is under way (Strategy.MaxSurge).
	Surge bool `json:"surge,omitempty" yaml:"surge,omitempty"`
	// SpecHash identifies the rendered spec; see SpecHash.
	SpecHash string   `json:"specHash" yaml:"specHash"`
	Source   Position `json:"source" yaml:"source"`
}

// JailSpec is an instance's resolved spec.
type JailSpec struct {
	Image         string            `json:"image" yaml:"image"`
	Command       []string          `json:"command" yaml:"command"`
	Env           map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	Network       Network           `json:"network" yaml:"network"`
	Resources     Resources         `json:"resources" yaml:"resources"`
	RestartPolicy string            `json:"restartPolicy" yaml:"restartPolicy"`
	Volumes       []Volume          `json:"volumes,omitempty" yaml:"volumes,omitempty"`
	// Artifacts are files fetched for the instance, checked against
	// their sha256 and placed in its root before it starts.
	Artifacts []Artifact `json:"artifacts,omitempty" yaml:"artifacts,omitempty"`
	// Checks are the instance's health checks, defaults applied: a
	// Service replica without a readiness check gets a TCP one on the
	// Service's port (Check.Default).
	Checks Checks `json:"checks,omitzero" yaml:"checks,omitempty"`
	// TerminationGracePeriod is how long the instance's command has
	// between SIGTERM and SIGKILL when it is stopped.
	TerminationGracePeriod Duration `json:"terminationGracePeriod,omitzero" yaml:"terminationGracePeriod,omitempty"`
}

// Checks are an instance's health checks (docs/spec.md, "Health checks").
// A nil check is not run.
type Checks struct {
	// Startup, until it first passes, holds Readiness and Liveness off.
	Startup *Check `json:"startup,omitempty" yaml:"startup,omitempty"`
	// Readiness decides whether the instance receives traffic and counts
	// as available in a rollout.
	Readiness *Check `json:"readiness,omitempty" yaml:"readiness,omitempty"`
	// Liveness restarts the instance (with the restart backoff) when it
	// fails FailureThreshold times in a row.
	Liveness *Check `json:"liveness,omitempty" yaml:"liveness,omitempty"`
}

// Check is one health check: exactly one of TCP, HTTP and Exec is set.
type Check struct {
	TCP  *TCPCheck  `json:"tcp,omitempty" yaml:"tcp,omitempty"`
	HTTP *HTTPCheck `json:"http,omitempty" yaml:"http,omitempty"`
	Exec *ExecCheck `json:"exec,omitempty" yaml:"exec,omitempty"`
	// Period is the time between two runs once the check has passed;
	// until it first passes it runs sooner (docs/spec.md).
	Period Duration `json:"period,omitzero" yaml:"period,omitempty"`
	// Timeout bounds one run; a run that takes longer fails.
	Timeout Duration `json:"timeout,omitzero" yaml:"timeout,omitempty"`
	// SuccessThreshold is how many passes in a row turn a failing check
	// passing, FailureThreshold how many failures in a row turn a passing
	// one failing.
	SuccessThreshold int `json:"successThreshold" yaml:"successThreshold"`
	FailureThreshold int `json:"failureThreshold" yaml:"failureThreshold"`
	// Default is set on the readiness check render adds to a Service
	// replica whose spec has none.
	Default bool `json:"default,omitempty" yaml:"default,omitempty"`
}

// TCPCheck passes when a TCP connection to the instance's address and
// Port is accepted.
type TCPCheck struct {
	Port int `json:"port" yaml:"port"`
}

// HTTPCheck passes when GET http://<address>:Port<Path>, sent with Host
// (the address when empty), answers with a status in [StatusMin,
// StatusMax].
type HTTPCheck struct {
	Port      int    `json:"port" yaml:"port"`
	Path      string `json:"path" yaml:"path"`
	Host      string `json:"host,omitempty" yaml:"host,omitempty"`
	StatusMin int    `json:"statusMin" yaml:"statusMin"`
	StatusMax int    `json:"statusMax" yaml:"statusMax"`
}

// ExecCheck passes when Command, run inside the instance, exits 0.
type ExecCheck struct {
	Command []string `json:"command" yaml:"command"`
}

// Network is how the jail is attached. Address is set only when the spec
// gives one; otherwise the planner assigns it.
type Network struct {
	VNet    bool   `json:"vnet" yaml:"vnet"`
	Bridge  string `json:"bridge" yaml:"bridge"`
	Address Addr   `json:"address,omitzero" yaml:"address,omitempty"`
}

// Resources are both what placement reserves on a node and the limits
// applied to the running jail.
type Resources struct {
	CPU    CPU   `json:"cpu" yaml:"cpu"`
	Memory Bytes `json:"memory" yaml:"memory"`
}

// Volume is a persistent dataset mounted into the jail. Name is the
// expanded, cluster-unique name (a replica's volumes are <replica>-<volume>).
type Volume struct {
	Name      string `json:"name" yaml:"name"`
	MountPath string `json:"mountPath" yaml:"mountPath"`
	// Size is the dataset quota; 0 means no quota.
	Size Bytes `json:"size,omitempty" yaml:"size,omitempty"`
}

// Artifact is a file fetched for an instance (docs/spec.md,
// "Artifacts") and placed in its root each time it starts.
type Artifact struct {
	// URL is where it comes from: https://host/path, or
	// oci://registry/repository@sha256:<manifest> (an OCI artifact: of
	// its manifest's layers, the one whose digest is sha256:SHA256).
	URL string `json:"url" yaml:"url"`
	// SHA256 is the hex SHA-256 of the file fetched (of the archive, for
	// one extracted): nothing else is placed.
	SHA256 string `json:"sha256" yaml:"sha256"`
	// Path is where it goes in the instance's root, absolute and clean:
	// the file itself, or the directory an archive is extracted into.
	Path string `json:"path" yaml:"path"`
	// Mode is the file's permission bits (DefaultArtifactMode when left
	// out); 0 for an archive, whose entries keep their own.
	Mode FileMode `json:"mode,omitempty" yaml:"mode,omitempty"`
	// Archive is how the file is extracted: "" (placed as it is),
	// ArchiveTar, ArchiveTarGz or ArchiveTarZstd.
	Archive string `json:"archive,omitempty" yaml:"archive,omitempty"`
}

// The archive formats an artifact may be extracted from.
const (
	ArchiveTar     = "tar"
	ArchiveTarGz   = "tar.gz"
	ArchiveTarZstd = "tar.zst"
)

// DefaultArtifactMode is an artifact file's mode when the spec gives none.
const DefaultArtifactMode FileMode = 0o644

// FileMode is a file's permission bits (0 to 0777), written in octal
// ("0755").
type FileMode uint32

// String is the mode in octal with a leading 0: "0755".
func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

// Ingress routes HTTPS for a host (and path prefix) to a Service.
type Ingress struct {
	Name    string   `json:"name" yaml:"name"`
	Host    string   `json:"host" yaml:"host"`
	Path    string   `json:"path" yaml:"path"`
	Backend Backend  `json:"backend" yaml:"backend"`
	TLS     *TLS     `json:"tls,omitempty" yaml:"tls,omitempty"`
	Source  Position `json:"source" yaml:"source"`
}

// Backend is the Service an Ingress sends requests to, and the port its
// endpoints listen on.
type Backend struct {
	Service string `json:"service" yaml:"service"`
	Port    int    `json:"port" yaml:"port"`
}

// TLS asks for an ACME certificate for the Ingress's host.
type TLS struct {
	Email string `json:"email" yaml:"email"`
}

// Node returns the node named name, or nil.
func (m *Model) Node(name string) *Node {
	return find(m.Nodes, name, func(n *Node) string { return n.Name })
}

// Service returns the Service named name, or nil.
func (m *Model) Service(name string) *Service {
	return find(m.Services, name, func(s *Service) string { return s.Name })
}

// Instance returns the instance named name, or nil.
func (m *Model) Instance(name string) *Instance {
	return find(m.Instances, name, func(i *Instance) string { return i.Name })
}

// find looks name up in s, which is sorted by name.
func find[T any](s []T, name string, key func(*T) string) *T {
	// By index: a comparison function taking the element by value would
	// copy it to the heap at every step.
	i := sort.Search(len(s), func(i int) bool { return key(&s[i]) >= name })
	if i == len(s) || key(&s[i]) != name {
		return nil
	}
	return &s[i]
}
