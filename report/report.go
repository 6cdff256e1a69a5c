// Package report defines the node status report: the file report.yaml that
// each agent publishes on its own ref (refs/keel/reports/<node>), and that
// every agent, keel plan and keel status read to learn what runs where. The
// format is a public interface, documented in docs/reports.md.
//
// The package only parses, checks and writes reports; fetching and pushing
// them is sync's job. It must stay pure (no I/O, no clock).
package report

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/keel-dev/keel/render"
)

// Kind is the kind of a report document.
const Kind = "Report"

// FileName is the name of the report file in the report commit.
const FileName = "report.yaml"

// State is what an instance is doing on its node.
type State string

const (
	StateStarting  State = "starting"  // created, its command not yet up
	StateRunning   State = "running"   // its command is up
	StateCrashLoop State = "crashloop" // exited and waiting to be restarted
	StateFailed    State = "failed"    // exited and will not be restarted
	StateStopped   State = "stopped"   // stopped on purpose
	StatePulling   State = "pulling"   // its image is being pulled: it does not run yet
)

// States lists every valid state.
var States = []State{StatePulling, StateStarting, StateRunning, StateCrashLoop, StateFailed, StateStopped}

// Report is one node's status.
type Report struct {
	APIVersion string    `yaml:"apiVersion" json:"apiVersion"`
	Kind       string    `yaml:"kind" json:"kind"`
	Node       string    `yaml:"node" json:"node"`
	Time       time.Time `yaml:"time" json:"time"`
	// Clock is the sender's own clock when it wrote the report; Time may
	// be later (it follows the peers' clocks). Peers follow Clock, not
	// Time, so that a lead does not feed on itself. Zero in reports of
	// older agents: Time stands in for it.
	Clock time.Time `yaml:"clock,omitempty" json:"clock,omitzero"`
	// Since is the Time of the first report of the node's current unbroken
	// run: no two consecutive reports it published more than livenessTTL
	// apart. The agent restarts the run when it starts and after a gap.
	// Peers hold a node whose run is shorter than the settle period as
	// settling (planner.SettlePeriod). Never after Time; zero in reports
	// of older agents.
	Since        time.Time `yaml:"since,omitempty" json:"since,omitzero"`
	AgentVersion string    `yaml:"agentVersion" json:"agentVersion"`
	Commit       string    `yaml:"commit" json:"commit"`
	PlanID       string    `yaml:"planID" json:"planID"`
	Refused      *Refusal  `yaml:"refused,omitempty" json:"refused,omitempty"`
	// Decommissioned says that the node's applied commit no longer lists
	// it in the inventory: it is leaving, stops what it holds (its
	// volumes stay) and runs nothing new.
	Decommissioned bool `yaml:"decommissioned,omitempty" json:"decommissioned,omitempty"`
	// Problems are the host prerequisites that do not hold on the node,
	// each with its fix, as its driver's checks last found them.
	Problems     []Problem     `yaml:"problems,omitempty" json:"problems,omitempty"`
	Capacity     Capacity      `yaml:"capacity" json:"capacity"`
	Instances    []Instance    `yaml:"instances" json:"instances"`
	Volumes      []Volume      `yaml:"volumes" json:"volumes"`
	Services     []Service     `yaml:"services,omitempty" json:"services,omitempty"`
	Certificates []Certificate `yaml:"certificates" json:"certificates"`
}

// Refusal says that the node did not apply the newest commit, and why.
type Refusal struct {
	Commit string `yaml:"commit" json:"commit"`
	Reason string `yaml:"reason" json:"reason"`
}

// Problem is a host prerequisite that does not hold on the node: what was
// checked (one of Checks), what is wrong, and what the operator does
// about it.
type Problem struct {
	Check   string `yaml:"check" json:"check"`
	Problem string `yaml:"problem" json:"problem"`
	Fix     string `yaml:"fix" json:"fix"`
}

// The checks a Problem may name. The list is fixed, as the instance states
// are: a name is a metric label (keel_node_problem{check}), and a reader
// refuses a report with a name it does not know.
const (
	// CheckDatasets: a parent dataset (<pool>/keel/jails, .../volumes)
	// is missing or mounted elsewhere.
	CheckDatasets = "datasets"
	// CheckForwarding: IP forwarding is off; traffic between nodes'
	// instances is dropped.
	CheckForwarding = "forwarding"
	// CheckRacct: resource accounting is off, so the node cannot enforce
	// resource limits: it refuses every instance that has some, and the
	// planner places none there (LimitsOff).
	CheckRacct = "racct"
	// CheckVNET: the kernel has no VNET; no jail can be created.
	CheckVNET = "vnet"
	// CheckPF: pf is off, or its ruleset does not evaluate Keel's anchor;
	// the ingress redirect does not work.
	CheckPF = "pf"
)

// Checks lists every check name, in the order the docs give them.
var Checks = []string{CheckDatasets, CheckForwarding, CheckRacct, CheckVNET, CheckPF}

// Bounds of Problems: a report with more, or longer texts, is refused.
// The agent trims what its driver gives it to fit (TrimProblems).
const (
	MaxProblems    = 32
	MaxProblemText = 512 // bytes of problem, and of fix, each
)

// LimitsOff reports whether the node says it cannot enforce resource
// limits (a CheckRacct problem).
func (r *Report) LimitsOff() bool {
	return slices.ContainsFunc(r.Problems, func(p Problem) bool { return p.Check == CheckRacct })
}

// TrimProblems returns ps made to fit a report: problems of an unknown
// check and those without a text are dropped, texts are cut (at a UTF-8
// boundary, marked with "…") to MaxProblemText, and at most MaxProblems
// are kept, in the canonical order. dropped counts what was left out.
func TrimProblems(ps []Problem) (out []Problem, dropped int) {
	for _, p := range ps {
		if !slices.Contains(Checks, p.Check) || p.Problem == "" {
			dropped++
			continue
		}
		p.Problem, p.Fix = cut(p.Problem), cut(p.Fix)
		out = append(out, p)
	}
	sortProblems(out)
	if len(out) > MaxProblems {
		dropped += len(out) - MaxProblems
		out = out[:MaxProblems]
	}
	return out, dropped
}

// TrimText shortens s to the MaxProblemText bytes a report's texts (a
// problem, a certificate's error) may have, ending in "…" when cut.
func TrimText(s string) string { return cut(s) }

// cut shortens s to at most MaxProblemText bytes, ending in "…" when cut.
func cut(s string) string {
	if len(s) <= MaxProblemText {
		return s
	}
	const ellipsis = "…"
	n := MaxProblemText - len(ellipsis)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + ellipsis
}

func sortProblems(ps []Problem) {
	slices.SortFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(slices.Index(Checks, a.Check), slices.Index(Checks, b.Check)),
			strings.Compare(a.Problem, b.Problem), strings.Compare(a.Fix, b.Fix))
	})
}

// Capacity is what the node can give to instances.
type Capacity struct {
	CPU    render.CPU   `yaml:"cpu,omitempty" json:"cpu,omitempty"`
	Memory render.Bytes `yaml:"memory,omitempty" json:"memory,omitempty"`
}

// Instance is one instance the node holds, in any state.
type Instance struct {
	Name     string     `yaml:"name" json:"name"`
	State    State      `yaml:"state" json:"state"`
	Address  netip.Addr `yaml:"address" json:"address"`
	SpecHash string     `yaml:"specHash" json:"specHash"`
	Restarts int        `yaml:"restarts" json:"restarts"`
	Error    string     `yaml:"error" json:"error"`
	// Generation counts the instance's placements on a new node: the
	// planner gives a copy started elsewhere the next generation, and the
	// newer copy wins when two live nodes report it (so an instance never
	// moves back on its own). Zero in reports of older agents.
	Generation int `yaml:"generation,omitempty" json:"generation,omitempty"`
	// Ready says whether the instance passes its readiness check (and its
	// startup check has passed): only a ready instance receives traffic
	// and counts as available in a rollout. Nil in reports of agents
	// that do not run checks, whose running instances count as ready.
	Ready *bool `yaml:"ready,omitempty" json:"ready,omitempty"`
	// ReadySince is when the instance last became ready (zero while it is
	// not), in the report's time: a rollout counts it available once it
	// has been ready for the Service's minReadySeconds.
	ReadySince time.Time `yaml:"readySince,omitempty" json:"readySince,omitzero"`
	// SpecSince is when the node first started the instance at its
	// SpecHash, in the report's time; restarts after a crash keep it. A
	// replica not ready within the Service's progressDeadline of it
	// fails the rollout.
	SpecSince time.Time `yaml:"specSince,omitempty" json:"specSince,omitzero"`
	// Check is the last failure of one of its checks ("readiness: …"),
	// empty while they pass.
	Check string `yaml:"check,omitempty" json:"check,omitempty"`
	// Pull is the pull of the OCI image the instance is to start from,
	// while the node has not got it: the instance is pulling, or the
	// copy it replaces keeps running (State says which).
	Pull *Pull `yaml:"pull,omitempty" json:"pull,omitempty"`
}

// Pull is an image pull an instance waits for.
type Pull struct {
	// Image is what is pulled: the image (registry/repository@sha256:<hex>),
	// or an artifact ("artifact sha256:<hex> <path>").
	Image string `yaml:"image" json:"image"`
	// Error is the last attempt's failure, Failures the attempts that
	// failed in a row (the next waits twice as long as the one before,
	// 1 s up to 5 min).
	Error    string `yaml:"error,omitempty" json:"error,omitempty"`
	Failures int    `yaml:"failures,omitempty" json:"failures,omitempty"`
	// SpecHash is the spec the instance is to start at once the image is
	// there, and Since when the node began to wait for it (the report's
	// time): a replica whose pull has not ended within its Service's
	// progressDeadline fails the rollout, as one that does not become
	// ready does.
	SpecHash string    `yaml:"specHash,omitempty" json:"specHash,omitempty"`
	Since    time.Time `yaml:"since,omitempty" json:"since,omitzero"`
}

// MaxPullImage bounds Pull.Image (as render bounds spec.image).
const MaxPullImage = 512

// IsReady reports whether the instance runs and is ready: a report of an
// agent that does not run checks (Ready nil) counts a running instance
// as ready.
func (i *Instance) IsReady() bool {
	return i.State == StateRunning && (i.Ready == nil || *i.Ready)
}

// maxGeneration bounds Generation: a report claiming more is refused
// rather than letting one copy win every tie for ever.
const maxGeneration = 1 << 30

// SenderClock is the sender's own clock: Clock, or Time without it.
func (r *Report) SenderClock() time.Time {
	if r.Clock.IsZero() {
		return r.Time
	}
	return r.Clock
}

// Volume is a volume the node holds (whether mounted or not).
type Volume struct {
	Name string `yaml:"name" json:"name"`
}

// Service is a Service proxy the node runs, with the endpoints it uses.
type Service struct {
	Name      string   `yaml:"name" json:"name"`
	VIP       string   `yaml:"vip" json:"vip"`
	Endpoints []string `yaml:"endpoints" json:"endpoints"`
}

// Certificate is a certificate the node serves for an Ingress host, or
// the last error of obtaining one. Expires is zero when the node has none.
type Certificate struct {
	Host    string    `yaml:"host" json:"host"`
	Expires time.Time `yaml:"expires" json:"expires"`
	// Serial (lowercase hex) and Issuer (the issuer's common name) name
	// the certificate: nodes that share one report the same serial.
	Serial string `yaml:"serial,omitempty" json:"serial,omitempty"`
	Issuer string `yaml:"issuer,omitempty" json:"issuer,omitempty"`
	Error  string `yaml:"error" json:"error"`
}

// Holds reports whether c is a certificate valid at now.
func (c Certificate) Holds(now time.Time) bool {
	return !c.Expires.IsZero() && c.Expires.After(now)
}

// MaxCertificates bounds the certificates a report lists.
const MaxCertificates = 4096

// raw mirrors Report with the typed scalars as text, so that a report
// written by hand or by another version is read with clear errors. Unknown
// fields are ignored: newer agents may add some.
type raw struct {
	APIVersion   string    `yaml:"apiVersion"`
	Kind         string    `yaml:"kind"`
	Node         string    `yaml:"node"`
	Time         time.Time `yaml:"time"`
	Clock        time.Time `yaml:"clock"`
	Since        time.Time `yaml:"since"`
	AgentVersion string    `yaml:"agentVersion"`
	Commit       string    `yaml:"commit"`
	PlanID       string    `yaml:"planID"`
	Refused      *Refusal  `yaml:"refused"`
	Problems     []Problem `yaml:"problems"`
	Capacity     struct {
		CPU    string `yaml:"cpu"`
		Memory string `yaml:"memory"`
	} `yaml:"capacity"`
	Instances []struct {
		Name       string    `yaml:"name"`
		State      string    `yaml:"state"`
		Address    string    `yaml:"address"`
		SpecHash   string    `yaml:"specHash"`
		Restarts   int       `yaml:"restarts"`
		Error      string    `yaml:"error"`
		Generation int       `yaml:"generation"`
		Ready      *bool     `yaml:"ready"`
		ReadySince time.Time `yaml:"readySince"`
		SpecSince  time.Time `yaml:"specSince"`
		Check      string    `yaml:"check"`
		Pull       *Pull     `yaml:"pull"`
	} `yaml:"instances"`
	Volumes      []Volume      `yaml:"volumes"`
	Services     []Service     `yaml:"services"`
	Certificates []Certificate `yaml:"certificates"`
}

var (
	name    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	hexRe   = regexp.MustCompile(`^[0-9a-f]*$`)
	hostRe  = regexp.MustCompile(`^[a-z0-9*]([-a-z0-9.]*[a-z0-9])?$`)
	maxSize = 4 << 20 // a report larger than this is refused unread
)

// Parse reads a report published on the ref of node refNode. It fails when
// the report does not parse, has a wrong type, or speaks for another node.
func Parse(data []byte, refNode string) (Report, error) {
	r, err := ParseFile(data)
	if err != nil {
		return Report{}, err
	}
	if r.Node != refNode {
		return Report{}, fmt.Errorf("report names node %q but is published for node %q", r.Node, refNode)
	}
	return r, nil
}

// ParseFile reads a report that is not bound to a ref (a file given to keel
// plan --reports): the node is the one it names.
func ParseFile(data []byte) (Report, error) {
	if len(data) > maxSize {
		return Report{}, fmt.Errorf("report is %d bytes, more than the %d allowed", len(data), maxSize)
	}
	var r raw
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("report does not parse: %w", err)
	}
	if r.APIVersion != render.APIVersion || r.Kind != Kind {
		return Report{}, fmt.Errorf("not a report (want apiVersion %s, kind %s)", render.APIVersion, Kind)
	}
	if !name.MatchString(r.Node) || len(r.Node) > render.MaxNameLength {
		return Report{}, fmt.Errorf("node: %q is not a valid node name", r.Node)
	}
	if r.Time.IsZero() {
		return Report{}, fmt.Errorf("report has no time")
	}
	if r.Since.After(r.Time) {
		return Report{}, fmt.Errorf("since: %s is after the report's time %s", r.Since.UTC().Format(time.RFC3339Nano), r.Time.UTC().Format(time.RFC3339Nano))
	}
	out := Report{
		APIVersion: r.APIVersion, Kind: r.Kind, Node: r.Node, Time: r.Time.UTC(), Clock: r.Clock.UTC(), Since: r.Since.UTC(),
		AgentVersion: r.AgentVersion, Commit: r.Commit, PlanID: r.PlanID, Refused: r.Refused,
		Volumes: r.Volumes, Services: r.Services, Certificates: r.Certificates,
	}
	if len(r.Problems) > MaxProblems {
		return Report{}, fmt.Errorf("problems: %d listed, more than the %d allowed", len(r.Problems), MaxProblems)
	}
	for i, p := range r.Problems {
		switch {
		case !slices.Contains(Checks, p.Check):
			return Report{}, fmt.Errorf("problems[%d].check: %.64q is not a check (want one of %s)", i, p.Check, strings.Join(Checks, ", "))
		case p.Problem == "":
			return Report{}, fmt.Errorf("problems[%d].problem: empty", i)
		case len(p.Problem) > MaxProblemText || len(p.Fix) > MaxProblemText:
			return Report{}, fmt.Errorf("problems[%d]: problem and fix may have %d bytes each", i, MaxProblemText)
		}
	}
	out.Problems = r.Problems
	if !hexRe.MatchString(r.Commit) || !hexRe.MatchString(r.PlanID) {
		return Report{}, fmt.Errorf("commit and planID must be hexadecimal")
	}
	if r.Capacity.CPU != "" {
		if err := out.Capacity.CPU.UnmarshalText([]byte(r.Capacity.CPU)); err != nil {
			return Report{}, fmt.Errorf("capacity.cpu: %w", err)
		}
	}
	if r.Capacity.Memory != "" {
		if err := out.Capacity.Memory.UnmarshalText([]byte(r.Capacity.Memory)); err != nil {
			return Report{}, fmt.Errorf("capacity.memory: %w", err)
		}
	}
	seen := map[string]bool{}
	for i, in := range r.Instances {
		if seen[in.Name] {
			return Report{}, fmt.Errorf("instances[%d].name: %q is listed twice", i, in.Name)
		}
		seen[in.Name] = true
		if !name.MatchString(in.Name) || len(in.Name) > render.MaxNameLength {
			return Report{}, fmt.Errorf("instances[%d].name: %q is not a valid name", i, in.Name)
		}
		st := State(in.State)
		if !slices.Contains(States, st) {
			return Report{}, fmt.Errorf("instances[%d].state: %q is not a state", i, in.State)
		}
		if in.Generation < 0 || in.Generation > maxGeneration {
			return Report{}, fmt.Errorf("instances[%d].generation: %d is not between 0 and %d", i, in.Generation, maxGeneration)
		}
		if len(in.Check) > MaxProblemText {
			return Report{}, fmt.Errorf("instances[%d].check: more than %d bytes", i, MaxProblemText)
		}
		if p := in.Pull; p != nil {
			if p.Image == "" || len(p.Image) > MaxPullImage || len(p.Error) > MaxProblemText || p.Failures < 0 || len(p.SpecHash) > 64 || !hexRe.MatchString(p.SpecHash) {
				return Report{}, fmt.Errorf("instances[%d].pull: an image of 1 to %d bytes, an error of at most %d, failures not negative and a hexadecimal specHash", i, MaxPullImage, MaxProblemText)
			}
			p.Since = p.Since.UTC()
			if p.Since.IsZero() {
				p.Since = time.Time{}
			}
		}
		inst := Instance{Name: in.Name, State: st, SpecHash: in.SpecHash, Restarts: in.Restarts, Error: in.Error, Generation: in.Generation,
			Ready: in.Ready, ReadySince: in.ReadySince.UTC(), SpecSince: in.SpecSince.UTC(), Check: in.Check, Pull: in.Pull}
		if inst.ReadySince.IsZero() {
			inst.ReadySince = time.Time{}
		}
		if inst.SpecSince.IsZero() {
			inst.SpecSince = time.Time{}
		}
		if in.Address != "" {
			a, err := netip.ParseAddr(in.Address)
			if err != nil || !a.Is4() {
				return Report{}, fmt.Errorf("instances[%d].address: %q is not an IPv4 address", i, in.Address)
			}
			inst.Address = a
		}
		out.Instances = append(out.Instances, inst)
	}
	for i, v := range out.Volumes {
		if !name.MatchString(v.Name) {
			return Report{}, fmt.Errorf("volumes[%d].name: %q is not a valid name", i, v.Name)
		}
	}
	if len(out.Certificates) > MaxCertificates {
		return Report{}, fmt.Errorf("certificates: %d listed, more than the %d allowed", len(out.Certificates), MaxCertificates)
	}
	for i, c := range out.Certificates {
		switch {
		case c.Host == "" || len(c.Host) > 253 || !hostRe.MatchString(c.Host):
			return Report{}, fmt.Errorf("certificates[%d].host: %.64q is not a host name", i, c.Host)
		case !hexRe.MatchString(c.Serial) || len(c.Serial) > 64:
			return Report{}, fmt.Errorf("certificates[%d].serial: want at most 64 lowercase hexadecimal digits", i)
		case len(c.Issuer) > 256 || len(c.Error) > MaxProblemText:
			return Report{}, fmt.Errorf("certificates[%d]: issuer may have 256 bytes, error %d", i, MaxProblemText)
		}
		out.Certificates[i].Expires = c.Expires.UTC()
	}
	return out, nil
}

// Marshal writes the report in its canonical form: problems (by check in
// the order of Checks, then text), instances, volumes, services and
// certificates sorted, so that equal content gives equal bytes.
func (r Report) Marshal() []byte {
	r.APIVersion, r.Kind = render.APIVersion, Kind
	r.Time = r.Time.UTC()
	r.Clock = r.Clock.UTC()
	r.Since = r.Since.UTC()
	r.Problems = slices.Clone(r.Problems)
	sortProblems(r.Problems)
	r.Instances = slices.Clone(r.Instances)
	slices.SortFunc(r.Instances, func(a, b Instance) int { return strings.Compare(a.Name, b.Name) })
	r.Volumes = slices.Clone(r.Volumes)
	slices.SortFunc(r.Volumes, func(a, b Volume) int { return strings.Compare(a.Name, b.Name) })
	r.Services = slices.Clone(r.Services)
	slices.SortFunc(r.Services, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
	r.Certificates = slices.Clone(r.Certificates)
	slices.SortFunc(r.Certificates, func(a, b Certificate) int { return strings.Compare(a.Host, b.Host) })
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(r); err != nil {
		panic(err) // plain data: cannot fail
	}
	_ = enc.Close()
	return b.Bytes()
}

// ContentDigest identifies what a report says, leaving out when it was
// said (Time, Clock, Since): two reports with the same digest differ only
// by a heartbeat. Agents announce it over gossip, so that a peer fetches a
// report when its content changed, never for a heartbeat. It is 32
// lowercase hex digits (128 bits of SHA-256).
func ContentDigest(r Report) string {
	r.Time, r.Clock, r.Since = time.Time{}, time.Time{}, time.Time{}
	sum := sha256.Sum256(r.Marshal())
	return hex.EncodeToString(sum[:16])
}

// Instance returns the report's entry for the named instance, or nil.
func (r *Report) Instance(name string) *Instance {
	for i := range r.Instances {
		if r.Instances[i].Name == name {
			return &r.Instances[i]
		}
	}
	return nil
}
