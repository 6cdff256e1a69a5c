package render

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// Lock is the content of keel.lock: allocations that must never move once
// made. It is written by keel lock and reviewed like go.sum.
type Lock struct {
	// Subnets maps a node to its /24 of the pod CIDR.
	Subnets map[string]Prefix
	// VIPs maps a Service to its virtual IP.
	VIPs map[string]Addr
	// Pins maps a stateful instance to the node that holds its volumes.
	Pins map[string]string
}

type lockDoc struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Subnets    map[string]Prefix `yaml:"subnets"`
	VIPs       map[string]Addr   `yaml:"vips"`
	Pins       map[string]string `yaml:"pins"`
}

// parseLock reads keel.lock strictly. Its decoder is returned so that later
// checks can point at an entry.
func parseLock(data []byte, diag *diagnoser) (Lock, *decoder) {
	dec := &decoder{file: LockFile, diag: diag, pos: map[string]Position{}}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		pos, msg, ok := yamlSyntaxError(LockFile, data)
		if !ok {
			pos, msg = Position{File: LockFile, Line: 1, Column: 1}, "invalid YAML: "+strings.TrimPrefix(err.Error(), "yaml: ")
		}
		diag.errorf(pos, "", "%s", msg)
		return Lock{}, dec
	}
	if len(root.Content) == 0 {
		return Lock{}, dec
	}
	var d lockDoc
	if dec.decodeDocument(root.Content[0], reflect.ValueOf(&d).Elem()); dec.refused {
		return Lock{}, dec
	}
	if d.APIVersion != APIVersion || d.Kind != "Lock" {
		diag.errorf(dec.at("kind"), "kind", "keel.lock must start with apiVersion: %s and kind: Lock", APIVersion)
	}
	checkEntries(dec, "subnets", d.Subnets, func(p Prefix) bool { return p.IsValid() })
	checkEntries(dec, "vips", d.VIPs, func(a Addr) bool { return a.IsValid() })
	checkEntries(dec, "pins", d.Pins, func(n string) bool { return checkName(n) == "" })
	return Lock{Subnets: d.Subnets, VIPs: d.VIPs, Pins: d.Pins}, dec
}

// checkEntries reports lock entries with a bad name or no valid value, and
// removes them so that allocation never sees them.
func checkEntries[V any](dec *decoder, section string, entries map[string]V, valid func(V) bool) {
	for _, name := range sortedKeys(entries) {
		f := section + "." + name
		if msg := checkName(name); msg != "" {
			dec.diag.errorf(dec.at(f+"#key"), f, "%s", msg)
			delete(entries, name)
		} else if !valid(entries[name]) {
			dec.diag.errorf(dec.at(f), f, "missing or invalid value; remove the entry and run keel lock")
			delete(entries, name)
		}
	}
}

// checkLock reports lock entries that name things that no longer exist, pins
// that cannot hold, and allocations that are not locked yet.
func (r *renderer) checkLock(m *Model) {
	if !r.hasLock {
		if len(m.Nodes)+len(m.Services) > 0 {
			r.diag.warnf(Position{File: LockFile}, "", "missing: node subnets and service VIPs are derived from names; run keel lock to pin them so that later changes never move them")
		}
		return
	}
	at := r.lockDec.at
	for _, name := range sortedKeys(r.lock.Subnets) {
		n := m.Node(name)
		switch {
		case n == nil:
			r.diag.warnf(at("subnets."+name), "subnets."+name, "node %s is not in the inventory; run keel lock to drop the entry", name)
		case n.PodCIDRSource == SourceExplicit && n.PodCIDR != r.lock.Subnets[name]:
			r.diag.warnf(at("subnets."+name), "subnets."+name, "node %s's spec.podCIDR is %s, which wins over the lock; run keel lock to record it", name, n.PodCIDR)
		}
	}
	for _, name := range sortedKeys(r.lock.VIPs) {
		if m.Service(name) == nil {
			r.diag.warnf(at("vips."+name), "vips."+name, "service %s no longer exists; run keel lock to drop the entry", name)
		}
	}
	for _, name := range sortedKeys(r.lock.Pins) {
		node := r.lock.Pins[name]
		inst := m.Instance(name)
		f := "pins." + name
		switch {
		case inst == nil || !inst.Stateful:
			r.diag.warnf(at(f), f, "%s is not a stateful instance any more; run keel lock to drop the pin", name)
		case m.Node(node) == nil:
			r.diag.errorf(at(f), f, "%s is pinned to node %s, which is not in the inventory: if %s is gone for good (its volumes with it), delete this pin and run keel lock to place %s anew; otherwise restore %s/%s.yaml", name, node, node, name, NodesDir, node)
		case inst.Node != "" && inst.Node != node:
			r.diag.errorf(at(f), f, "%s is pinned to node %s but its spec asks for node %s: a stateful instance moves only when its pin is changed (its volumes stay behind on %s)", name, node, inst.Node, node)
		}
	}
	for _, inst := range m.Instances {
		if _, pinned := r.lock.Pins[inst.Name]; inst.Stateful && !pinned {
			r.diag.warnf(inst.Source, "metadata.name", "keel.lock has no pin for stateful %s; run keel lock to pin it to the node the planner places it on", inst.Name)
		}
	}
	for _, n := range m.Nodes {
		if n.PodCIDRSource == SourceDerived {
			r.diag.warnf(n.Source, "metadata.name", "keel.lock has no entry for node %s; run keel lock to pin its subnet %s", n.Name, n.PodCIDR)
		}
	}
	for _, s := range m.Services {
		if s.VIPSource == SourceDerived {
			r.diag.warnf(s.Source, "metadata.name", "keel.lock has no entry for service %s; run keel lock to pin its VIP %s", s.Name, s.VIP)
		}
	}
}

// NewLock returns the lock that keel lock writes for model m: every node's
// subnet and every Service's VIP as allocated, and the existing pins of
// stateful instances that still exist. Entries of deleted things are dropped
// and no existing entry is changed (an explicit spec.podCIDR excepted, since
// the spec wins).
func NewLock(m *Model) Lock {
	l := Lock{Subnets: map[string]Prefix{}, VIPs: map[string]Addr{}, Pins: map[string]string{}}
	for _, n := range m.Nodes {
		if n.PodCIDR.IsValid() {
			l.Subnets[n.Name] = n.PodCIDR
		}
	}
	for _, s := range m.Services {
		if s.VIP.IsValid() {
			l.VIPs[s.Name] = s.VIP
		}
	}
	for inst, node := range m.Lock.Pins {
		if i := m.Instance(inst); i != nil && i.Stateful && m.Node(node) != nil {
			l.Pins[inst] = node
		}
	}
	return l
}

// Equal reports whether two locks hold the same entries.
func (l Lock) Equal(o Lock) bool {
	return mapEq(l.Subnets, o.Subnets) && mapEq(l.VIPs, o.VIPs) && mapEq(l.Pins, o.Pins)
}

func mapEq[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Diff lists, one line each, how o differs from l: "+ vips.web: 10.201.4.7"
// for an entry o adds, "- ..." for one it drops, "~ ..." for one it changes.
func (l Lock) Diff(o Lock) []string {
	var out []string
	out = append(out, diffMap("subnets", l.Subnets, o.Subnets)...)
	out = append(out, diffMap("vips", l.VIPs, o.VIPs)...)
	out = append(out, diffMap("pins", l.Pins, o.Pins)...)
	return out
}

func diffMap[V comparable](section string, a, b map[string]V) []string {
	var out []string
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		va, ina := a[k]
		vb, inb := b[k]
		switch {
		case ina && !inb:
			out = append(out, fmt.Sprintf("- %s.%s: %v", section, k, va))
		case !ina && inb:
			out = append(out, fmt.Sprintf("+ %s.%s: %v", section, k, vb))
		case va != vb:
			out = append(out, fmt.Sprintf("~ %s.%s: %v -> %v", section, k, va, vb))
		}
	}
	return out
}

// Marshal writes the lock in its canonical form: fixed key order, one entry
// a line, so that diffs in review are minimal.
func (l Lock) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString("# keel.lock: allocations made by `keel lock`. Review changes like go.sum;\n")
	b.WriteString("# an entry never changes once written. Regenerate with `keel lock`.\n")
	fmt.Fprintf(&b, "apiVersion: %s\nkind: Lock\n", APIVersion)
	section := func(name string, keys []string, value func(string) string) {
		if len(keys) == 0 {
			fmt.Fprintf(&b, "%s: {}\n", name)
			return
		}
		fmt.Fprintf(&b, "%s:\n", name)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: %s\n", k, value(k))
		}
	}
	section("subnets", sortedKeys(l.Subnets), func(k string) string { return l.Subnets[k].String() })
	section("vips", sortedKeys(l.VIPs), func(k string) string { return l.VIPs[k].String() })
	section("pins", sortedKeys(l.Pins), func(k string) string { return l.Pins[k] })
	return b.Bytes()
}
