package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ChangeClass says what a change to a field does to a running instance (the
// table "What a change does" in docs/spec.md).
type ChangeClass string

const (
	// ChangeReplace destroys the jail and creates it again, with the same
	// name, node and address; volumes are kept.
	ChangeReplace ChangeClass = "replace"
	// ChangeRestart restarts the jail's command.
	ChangeRestart ChangeClass = "restart"
	// ChangeLive is applied to the running jail without a restart.
	ChangeLive ChangeClass = "live"
	// ChangeProxy changes only the Service proxies.
	ChangeProxy ChangeClass = "proxy"
	// ChangeScale adds or removes replicas.
	ChangeScale ChangeClass = "scale"
	// ChangeMove moves a stateless instance to a node that matches.
	ChangeMove ChangeClass = "move"
)

// FieldChange is one field that differs between two renderings of an
// instance, with what changing it does.
type FieldChange struct {
	Field string      `json:"field"`
	Class ChangeClass `json:"class"`
	// Detail says what changed, old → new ("image: base/a → base/b"),
	// with the values of secret-looking environment variables masked and
	// long values cut (MaskedValue, cutValue).
	Detail string `json:"detail,omitempty"`
}

// The parts of a spec that each class of change covers. A specHash is the
// concatenation of one hash per part, so that comparing two hashes tells
// which class of change separates them without the old spec at hand.
type replacePart struct {
	Image   string   `json:"image"`
	VNet    bool     `json:"vnet"`
	Bridge  string   `json:"bridge"`
	Address string   `json:"address"`
	Volumes []Volume `json:"volumes"`
	// Left out when there are none, so that a spec without artifacts
	// hashes as it did before they existed.
	Artifacts []Artifact `json:"artifacts,omitempty"`
}

type restartPart struct {
	Command []string          `json:"command"`
	Env     map[string]string `json:"env"`
	// Checks are those the spec writes (the default readiness check
	// left out): a change of them rolls out, paced, so that a broken
	// check stops the rollout after one replica rather than turning
	// every replica unready at once. Left out when there are none, so
	// that a spec without them hashes as it did before checks existed.
	Checks Checks `json:"checks,omitzero"`
}

type livePart struct {
	Resources     Resources `json:"resources"`
	RestartPolicy string    `json:"restartPolicy"`
	// Left out when zero, so that a spec built without them (by a test,
	// say) hashes as it did before they existed. The checks are all of
	// them here: the default readiness check follows the Service's port
	// live.
	Checks                 Checks   `json:"checks,omitzero"`
	TerminationGracePeriod Duration `json:"terminationGracePeriod,omitzero"`
}

// hashedChecks is c without the marks of the checks render added: the
// default readiness check written out is the same check, and hashes the
// same.
func hashedChecks(c Checks) Checks {
	plain := func(c *Check) *Check {
		if c == nil || !c.Default {
			return c
		}
		p := *c
		p.Default = false
		return &p
	}
	return Checks{Startup: plain(c.Startup), Readiness: plain(c.Readiness), Liveness: plain(c.Liveness)}
}

// writtenChecks is c without the default readiness check render adds.
func writtenChecks(c Checks) Checks {
	if c.Readiness != nil && c.Readiness.Default {
		c.Readiness = nil
	}
	return c
}

func parts(s JailSpec) (any, any, any) {
	addr := ""
	if s.Network.Address.IsValid() {
		addr = s.Network.Address.String()
	}
	return replacePart{Image: s.Image, VNet: s.Network.VNet, Bridge: s.Network.Bridge, Address: addr, Volumes: s.Volumes, Artifacts: s.Artifacts},
		restartPart{Command: s.Command, Env: s.Env, Checks: writtenChecks(s.Checks)},
		livePart{Resources: s.Resources, RestartPolicy: s.RestartPolicy, Checks: hashedChecks(s.Checks), TerminationGracePeriod: s.TerminationGracePeriod}
}

// hashLen is the number of hex digits of each part of a specHash.
const hashLen = 16

func partHash(v any) string {
	b, err := json.Marshal(v) // maps are written with sorted keys
	if err != nil {
		panic(err) // only plain data types: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:hashLen/2])
}

// SpecHash returns the stable hash of a rendered spec: 48 hex digits, the
// first 16 covering what a replace changes (image, network, volumes,
// artifacts), the next 16 what a restart changes (command, env, the
// checks written), the last 16 what is applied live (resources,
// restartPolicy, checks, terminationGracePeriod).
func SpecHash(s JailSpec) string {
	a, b, c := parts(s)
	return partHash(a) + partHash(b) + partHash(c)
}

// ClassifyHashChange returns the most disruptive class of change between
// two specHashes ("" when they are equal). A hash that is not a specHash
// (an older agent's, say) counts as a replace.
func ClassifyHashChange(from, to string) ChangeClass {
	switch {
	case from == to:
		return ""
	case len(from) != 3*hashLen || len(to) != 3*hashLen || from[:hashLen] != to[:hashLen]:
		return ChangeReplace
	case from[hashLen:2*hashLen] != to[hashLen:2*hashLen]:
		return ChangeRestart
	default:
		return ChangeLive
	}
}

// CompareSpecs lists the fields that differ between two specs, each with its
// class, in a fixed order (most disruptive first).
func CompareSpecs(from, to JailSpec) []FieldChange {
	var out []FieldChange
	add := func(changed bool, field string, class ChangeClass, detail func() string) {
		if changed {
			out = append(out, FieldChange{Field: field, Class: class, Detail: field + ": " + detail()})
		}
	}
	arrow := func(a, b string) func() string { return func() string { return cutValue(a) + " → " + cutValue(b) } }
	add(from.Image != to.Image, "image", ChangeReplace, arrow(from.Image, to.Image))
	add(from.Network.VNet != to.Network.VNet, "network.vnet", ChangeReplace, arrow(fmt.Sprint(from.Network.VNet), fmt.Sprint(to.Network.VNet)))
	add(from.Network.Bridge != to.Network.Bridge, "network.bridge", ChangeReplace, arrow(from.Network.Bridge, to.Network.Bridge))
	add(from.Network.Address != to.Network.Address, "network.address", ChangeReplace, arrow(addrText(from.Network.Address), addrText(to.Network.Address)))
	add(!slices.Equal(from.Volumes, to.Volumes), "volumes", ChangeReplace, arrow(volumeText(from.Volumes), volumeText(to.Volumes)))
	add(!slices.Equal(from.Artifacts, to.Artifacts), "artifacts", ChangeReplace, func() string { return artifactsDiff(from.Artifacts, to.Artifacts) })
	add(!slices.Equal(from.Command, to.Command), "command", ChangeRestart, arrow(commandText(from.Command), commandText(to.Command)))
	add(!maps.Equal(from.Env, to.Env), "env", ChangeRestart, func() string { return envDiff(from.Env, to.Env) })
	add(from.Resources != to.Resources, "resources", ChangeLive, func() string {
		var parts []string
		if from.Resources.CPU != to.Resources.CPU {
			parts = append(parts, "cpu "+from.Resources.CPU.String()+" → "+to.Resources.CPU.String())
		}
		if from.Resources.Memory != to.Resources.Memory {
			parts = append(parts, "memory "+from.Resources.Memory.String()+" → "+to.Resources.Memory.String())
		}
		return strings.Join(parts, ", ")
	})
	add(from.RestartPolicy != to.RestartPolicy, "restartPolicy", ChangeLive, arrow(from.RestartPolicy, to.RestartPolicy))
	checksClass := ChangeLive // the default readiness check follows the port
	if !reflect.DeepEqual(writtenChecks(from.Checks), writtenChecks(to.Checks)) {
		checksClass = ChangeRestart
	}
	add(!reflect.DeepEqual(hashedChecks(from.Checks), hashedChecks(to.Checks)), "checks", checksClass, func() string { return checksDiff(from.Checks, to.Checks) })
	add(from.TerminationGracePeriod != to.TerminationGracePeriod, "terminationGracePeriod", ChangeLive, arrow(durationText(from.TerminationGracePeriod), durationText(to.TerminationGracePeriod)))
	return out
}

func durationText(d Duration) string {
	if d == 0 {
		return "(none)"
	}
	return d.String()
}

// checksDiff describes what changed between two specs' checks, check by
// check: +readiness: what it checks, -liveness, or startup: the fields
// that changed, old → new.
func checksDiff(from, to Checks) string {
	var parts []string
	for _, c := range []struct {
		name string
		a, b *Check
	}{{"startup", from.Startup, to.Startup}, {"readiness", from.Readiness, to.Readiness}, {"liveness", from.Liveness, to.Liveness}} {
		switch a, b := c.a, c.b; {
		case a == nil && b == nil:
		case a == nil:
			parts = append(parts, "+"+c.name+": "+cutValue(probeText(b)))
		case b == nil:
			parts = append(parts, "-"+c.name)
		default:
			var ch []string
			if pa, pb := probeText(a), probeText(b); pa != pb {
				ch = append(ch, cutValue(pa)+" → "+cutValue(pb))
			}
			field := func(name string, x, y any) {
				if x != y {
					ch = append(ch, fmt.Sprintf("%s %v → %v", name, x, y))
				}
			}
			field("period", a.Period, b.Period)
			field("timeout", a.Timeout, b.Timeout)
			field("successThreshold", a.SuccessThreshold, b.SuccessThreshold)
			field("failureThreshold", a.FailureThreshold, b.FailureThreshold)
			if len(ch) > 0 {
				parts = append(parts, c.name+": "+strings.Join(ch, ", "))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// probeText says what a check checks: "tcp 8080", "http 8080 /healthz",
// "exec /bin/check -q"; "(default)" marks the one render added.
func probeText(c *Check) string {
	var s string
	switch {
	case c.TCP != nil:
		s = fmt.Sprintf("tcp %d", c.TCP.Port)
	case c.HTTP != nil:
		h := c.HTTP
		s = fmt.Sprintf("http %d %s", h.Port, h.Path)
		if h.StatusMin != DefaultStatusMin || h.StatusMax != DefaultStatusMax {
			s += fmt.Sprintf(" status %d-%d", h.StatusMin, h.StatusMax)
		}
		if h.Host != "" {
			s += " host " + h.Host
		}
	case c.Exec != nil:
		s = "exec " + commandText(c.Exec.Command)
	}
	if c.Default {
		s += " (default)"
	}
	return s
}

// maxValueText bounds a value shown in a change's detail.
const maxValueText = 60

// cutValue shortens v for a change's detail, at a UTF-8 boundary.
func cutValue(v string) string {
	if len(v) <= maxValueText {
		return v
	}
	n := maxValueText
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n] + "…"
}

func addrText(a Addr) string {
	if !a.IsValid() {
		return "(assigned)"
	}
	return a.String()
}

func volumeText(vs []Volume) string {
	if len(vs) == 0 {
		return "(none)"
	}
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.Name + ":" + v.MountPath
	}
	return strings.Join(names, ", ")
}

// artifactsDiff describes what changed between two specs' artifacts, by
// path in order: +/path (sha256 abcd1234…), -/path, or /path: the fields
// that changed, old → new. A URL is shown without its query string, which
// may be a pre-signed URL's signature.
func artifactsDiff(from, to []Artifact) string {
	byPath := func(as []Artifact) map[string]Artifact {
		m := make(map[string]Artifact, len(as))
		for _, a := range as {
			if _, dup := m[a.Path]; !dup {
				m[a.Path] = a
			}
		}
		return m
	}
	a, b := byPath(from), byPath(to)
	var parts []string
	for _, p := range unionKeys(a, b) {
		x, inFrom := a[p]
		y, inTo := b[p]
		switch {
		case !inFrom:
			parts = append(parts, "+"+cutValue(p)+" (sha256 "+shortSum(y.SHA256)+")")
		case !inTo:
			parts = append(parts, "-"+cutValue(p))
		case x != y:
			var ch []string
			field := func(name, v, w string) {
				if v != w {
					ch = append(ch, name+" "+v+" → "+w)
				}
			}
			field("sha256", shortSum(x.SHA256), shortSum(y.SHA256))
			field("url", cutValue(urlText(x.URL)), cutValue(urlText(y.URL)))
			field("mode", modeText(x.Mode), modeText(y.Mode))
			field("archive", archiveText(x.Archive), archiveText(y.Archive))
			if len(ch) == 0 { // the query strings differ only
				ch = append(ch, "url query string changed")
			}
			parts = append(parts, cutValue(p)+": "+strings.Join(ch, ", "))
		}
	}
	if len(parts) == 0 {
		return "reordered"
	}
	return strings.Join(parts, "; ")
}

// shortSum is the first 8 hex digits of a sha256, for a change's detail.
func shortSum(sum string) string {
	if len(sum) <= 8 {
		return sum
	}
	return sum[:8] + "…"
}

// urlText is an artifact's URL without its query string.
func urlText(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i] + "?…"
	}
	return u
}

func modeText(m FileMode) string {
	if m == 0 {
		return "(none)"
	}
	return m.String()
}

func archiveText(a string) string {
	if a == "" {
		return "(none)"
	}
	return a
}

func commandText(c []string) string {
	if len(c) == 0 {
		return "(none)"
	}
	return strings.Join(c, " ")
}

// secretWords mark an environment variable whose value a change's detail
// never shows: its name holds one of them (case-insensitively).
var secretWords = []string{"SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "KEY", "CREDENTIAL", "AUTH", "PRIVATE", "CERT", "DSN"}

// MaskedValue returns the value of environment variable name as a plan
// may show it: "(masked)" when the name looks like a secret's.
func MaskedValue(name, value string) string {
	up := strings.ToUpper(name)
	for _, w := range secretWords {
		if strings.Contains(up, w) {
			return "(masked)"
		}
	}
	return strconv.Quote(cutValue(value))
}

// unionKeys are the keys of a and b together, sorted.
func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// envDiff describes what changed between two environments, by key in
// order: +KEY=value, -KEY, KEY: old → new; secret-looking values masked.
func envDiff(from, to map[string]string) string {
	var parts []string
	for _, k := range unionKeys(from, to) {
		a, inFrom := from[k]
		b, inTo := to[k]
		switch {
		case !inFrom:
			parts = append(parts, "+"+k+"="+MaskedValue(k, b))
		case !inTo:
			parts = append(parts, "-"+k)
		case a != b:
			parts = append(parts, k+": "+MaskedValue(k, a)+" → "+MaskedValue(k, b))
		}
	}
	return strings.Join(parts, ", ")
}
