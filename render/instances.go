package render

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// maxReplicas bounds a Service's replica count to catch typos (30000 for 3).
// The cluster as a whole is bounded by its maxInstances (see overCap).
const maxReplicas = 10000

var restartPolicies = []string{"Always", "OnFailure", "Never"}

// resolveSpec validates a Jail spec or a Service template (field is "spec"
// or "spec.template"; svc is the template's Service, nil for a Jail) and
// returns it with defaults applied. Volume names are returned as written;
// the caller expands them.
func (r *renderer) resolveSpec(in jailInput, field string, at func(string) Position, m *Model, svc *Service) JailSpec {
	f := func(sub string) string { return field + "." + sub }
	errorf := func(sub, format string, args ...any) { r.diag.errorf(at(f(sub)), f(sub), format, args...) }

	s := JailSpec{
		Image:         in.Image,
		Command:       in.Command,
		Env:           nonEmpty(in.Env),
		Network:       Network{VNet: in.Network.VNet, Bridge: in.Network.Bridge, Address: Addr{in.Network.Address.Addr}},
		Resources:     Resources{CPU: in.Resources.CPU, Memory: in.Resources.Memory},
		RestartPolicy: in.RestartPolicy,
	}
	if _, msg := parseImage(in.Image); msg != "" {
		errorf("image", "%s", msg)
	}
	if len(s.Command) == 0 {
		s.Command = slices.Clone(DefaultCommand)
	}
	r.checkArgv(in.Command, f("command"), at)
	for _, k := range slices.Sorted(maps.Keys(in.Env)) {
		keyErrorf := func(format string, args ...any) {
			r.diag.errorf(at(f("env."+k)+"#key"), f("env."+k), format, args...)
		}
		switch {
		case !envName.MatchString(k):
			keyErrorf("%q is not an environment variable name (letters, digits and '_', not starting with a digit)", k)
		case strings.HasPrefix(k, "KEEL_"):
			keyErrorf("%q: names starting with KEEL_ are set by the agent", k)
		case strings.ContainsRune(in.Env[k], 0):
			errorf("env."+k, "contains a NUL byte")
		}
	}
	if s.Network.Bridge == "" {
		s.Network.Bridge = m.Cluster.Bridge
	} else if !bridgeName.MatchString(s.Network.Bridge) {
		errorf("network.bridge", "%q is not a Keel bridge name (want keel<N>, e.g. keel0)", s.Network.Bridge)
	}
	if svc != nil && in.Network.Address.IsValid() {
		errorf("network.address", "not allowed in a Service template: each replica gets its own address")
		s.Network.Address = Addr{}
	}
	if s.Resources.CPU == 0 {
		s.Resources.CPU = DefaultCPU
	}
	if s.Resources.Memory == 0 {
		s.Resources.Memory = DefaultMemory
	}
	if s.RestartPolicy == "" {
		s.RestartPolicy = DefaultRestartPolicy
	} else if !slices.Contains(restartPolicies, s.RestartPolicy) {
		msg := fmt.Sprintf("%q is not a restart policy (want Always, OnFailure or Never)", s.RestartPolicy)
		if sug := suggest(s.RestartPolicy, restartPolicies); sug != "" {
			msg = fmt.Sprintf("%q is not a restart policy (did you mean %q?)", s.RestartPolicy, sug)
		}
		errorf("restartPolicy", "%s", msg)
	}
	names, paths := map[string]int{}, map[string]int{}
	for i, v := range in.Volumes {
		vf := fmt.Sprintf("volumes[%d]", i)
		if msg := checkName(v.Name); msg != "" {
			errorf(vf+".name", "%s", msg)
		} else if j, dup := names[v.Name]; dup {
			errorf(vf+".name", "duplicate volume %q (also volumes[%d])", v.Name, j)
		}
		names[v.Name] = i
		if msg := checkMountPath(v.MountPath); msg != "" {
			errorf(vf+".mountPath", "%s", msg)
		} else if j, dup := paths[cleanPath(v.MountPath)]; dup {
			errorf(vf+".mountPath", "%q is also the mount path of volumes[%d]", v.MountPath, j)
		}
		paths[cleanPath(v.MountPath)] = i
		s.Volumes = append(s.Volumes, Volume{Name: v.Name, MountPath: cleanPath(v.MountPath), Size: v.Size})
	}
	s.Artifacts = r.resolveArtifacts(in.Artifacts, in.Volumes, field, at)
	s.Checks = r.resolveChecks(in.Checks, f("checks"), at, svc)
	s.TerminationGracePeriod = r.resolveGracePeriod(in.TerminationGracePeriod, f("terminationGracePeriod"), at)
	return s
}

// nonEmpty returns nil for an empty map, so that "env: {}" and no env at
// all render (and hash) the same.
func nonEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

func cleanPath(p string) string {
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// checkPlacement validates spec.node and spec.nodeSelector.
func (r *renderer) checkPlacement(in jailInput, field string, at func(string) Position, m *Model) {
	if in.Node != "" {
		n := m.Node(in.Node)
		switch {
		case checkName(in.Node) != "":
			r.diag.errorf(at(field+".node"), field+".node", "%s", checkName(in.Node))
		case n == nil:
			r.diag.errorf(at(field+".node"), field+".node", "node %q is not in the inventory (%s/)", in.Node, NodesDir)
		case !matches(n.Labels, in.NodeSelector):
			r.diag.errorf(at(field+".node"), field+".node", "node %q does not match spec.nodeSelector", in.Node)
		}
	}
	r.checkLabels(in.NodeSelector, field+".nodeSelector", at)
	if len(in.NodeSelector) > 0 && !slices.ContainsFunc(m.Nodes, func(n Node) bool { return matches(n.Labels, in.NodeSelector) }) {
		r.diag.warnf(at(field+".nodeSelector"), field+".nodeSelector", "no node in the inventory matches; the instance cannot be placed until one does")
	}
}

// matches reports whether labels has every key and value of selector.
func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (r *renderer) buildInstances(m *Model) {
	names := map[string]Position{} // instance name → where it was declared
	volumes := map[string]volumeClaim{}
	addrs := map[netip.Addr]string{} // explicit address → instance
	claim := func(name string, pos Position, what string) bool {
		if first, dup := names[name]; dup {
			r.diag.errorf(pos, "metadata.name", "duplicate name %q%s: it is also declared at %s (Jails and Service replicas share one namespace)", name, what, first)
			return false
		}
		names[name] = pos
		return true
	}
	// unplaced is true for a Jail whose explicit address is in error: it
	// would have fixed the node, so the node is not compared (no second
	// error about the same mistake).
	claimVolumes := func(inst *Instance, at func(string) Position, field string, unplaced bool) {
		for i, v := range inst.Spec.Volumes {
			vf := fmt.Sprintf("%s.volumes[%d].name", field, i)
			if len(v.Name) > MaxNameLength {
				r.diag.errorf(at(vf), vf, "volume name %q is longer than %d characters", v.Name, MaxNameLength)
			}
			first, dup := volumes[v.Name]
			if !dup {
				volumes[v.Name] = volumeClaim{inst: inst.Name, service: inst.Service, node: inst.Node, unplaced: unplaced, size: v.Size}
				continue
			}
			if first.inst == inst.Name {
				continue
			}
			switch {
			case first.service != "" || inst.Service != "":
				r.diag.errorf(at(vf), vf, "volume %q is also a volume of %s: only Jails pinned to one node may share a volume, never a Service's replica", v.Name, first.inst)
			case !first.unplaced && !unplaced && (first.node == "" || first.node != inst.Node):
				r.diag.errorf(at(vf), vf, "volume %q is also a volume of %s: Jails share a volume only when spec.node (or the address) pins both to the same node (%s: %s, %s: %s)",
					v.Name, first.inst, inst.Name, nodeText(inst.Node), first.inst, nodeText(first.node))
			case first.size != v.Size:
				sf := fmt.Sprintf("%s.volumes[%d].size", field, i)
				if v.Size == 0 {
					sf = vf
				}
				r.diag.errorf(at(sf), sf, "volume %q is also a volume of %s with %s, here %s: Jails that share a volume must give it the same size",
					v.Name, first.inst, sizeText(first.size), sizeText(v.Size))
			}
		}
	}

	over := r.overCap(m)
	if !over {
		m.Instances = make([]Instance, 0, r.declaredInstances())
	}
	for _, d := range r.jails {
		r.checkMetadata(d.v.Metadata, d.at)
		name := d.v.Metadata.Name
		spec := r.resolveSpec(d.v.Spec, "spec", d.at, m, nil)
		r.checkPlacement(d.v.Spec, "spec", d.at, m)
		inst := Instance{
			Name:         name,
			Node:         d.v.Spec.Node,
			NodeSelector: nonEmpty(d.v.Spec.NodeSelector),
			Spec:         spec,
			Stateful:     len(spec.Volumes) > 0,
			Source:       d.at(""),
		}
		if a := spec.Network.Address; a.IsValid() {
			r.placeAddress(&inst, d.v.Spec.Network.Address.Prefix, d.at, m)
			if other, dup := addrs[a.Addr]; dup {
				r.diag.errorf(d.at("spec.network.address"), "spec.network.address", "%s is also the address of %s", a, other)
			}
			addrs[a.Addr] = name
		}
		if !claim(name, d.at("metadata.name"), "") {
			continue
		}
		claimVolumes(&inst, d.at, "spec", inst.Node == "" && d.written("spec.network.address"))
		inst.SpecHash = SpecHash(inst.Spec)
		m.Instances = append(m.Instances, inst)
	}

	services := map[string]Position{}
	for _, d := range r.services {
		r.checkMetadata(d.v.Metadata, d.at)
		name := d.v.Metadata.Name
		s := d.v.Spec
		svc := Service{Name: name, Port: s.Port, Replicas: 1, Source: d.at("")}
		if s.Replicas != nil {
			svc.Replicas = *s.Replicas
		}
		switch {
		case svc.Replicas < 0:
			r.diag.errorf(d.at("spec.replicas"), "spec.replicas", "%d: replicas cannot be negative", svc.Replicas)
			svc.Replicas = 0
		case svc.Replicas > maxReplicas:
			r.diag.errorf(d.at("spec.replicas"), "spec.replicas", "%d is more than %d replicas", svc.Replicas, maxReplicas)
			svc.Replicas = 0
		}
		switch {
		case s.Port == 0 && !d.written("spec.port"):
			r.diag.errorf(d.at("spec.port"), "spec.port", "required: the TCP port the replicas listen on and the VIP serves")
		case s.Port < 1 || s.Port > 65535:
			r.diag.errorf(d.at("spec.port"), "spec.port", "%d is not a TCP port (1-65535)", s.Port)
		}
		if first, dup := services[name]; dup {
			r.diag.errorf(d.at("metadata.name"), "metadata.name", "duplicate Service %q (also at %s)", name, first)
			continue
		}
		services[name] = d.at("metadata.name")
		tmpl := r.resolveSpec(s.Template, "spec.template", d.at, m, &svc)
		r.checkPlacement(s.Template, "spec.template", d.at, m)
		svc.Stateful = len(tmpl.Volumes) > 0
		svc.Strategy = r.resolveStrategy(s.Strategy, svc.Replicas, svc.Stateful, d.at)
		// Surge instances follow the replicas: <name>-<replicas+i>.
		total := svc.Replicas + svc.Strategy.MaxSurge
		if last := fmt.Sprintf("%s-%d", name, max(total-1, 0)); len(last) > MaxNameLength && checkName(name) == "" {
			what := "replica"
			if total > svc.Replicas {
				what = "surge instance"
			}
			r.diag.errorf(d.at("metadata.name"), "metadata.name", "%s name %q would be longer than %d characters", what, last, MaxNameLength)
		}
		if over {
			// Reported by overCap; expanding is what must not happen.
			m.Services = append(m.Services, svc)
			continue
		}
		svc.Instances = make([]string, 0, svc.Replicas)
		// Replicas without volumes have the same spec: hash it once. A
		// surge instance is never stateful: it has that spec too.
		var statelessHash string
		if len(tmpl.Volumes) == 0 {
			tmpl.Volumes = nil
			statelessHash = SpecHash(tmpl)
		}
		for i := range total {
			surge := i >= svc.Replicas
			rname := fmt.Sprintf("%s-%d", name, i)
			spec := tmpl
			spec.Volumes = make([]Volume, len(tmpl.Volumes))
			for j, v := range tmpl.Volumes {
				v.Name = rname + "-" + v.Name
				spec.Volumes[j] = v
			}
			if len(spec.Volumes) == 0 {
				spec.Volumes = nil
			}
			inst := Instance{
				Name:         rname,
				Service:      name,
				Index:        i,
				Node:         s.Template.Node,
				NodeSelector: nonEmpty(s.Template.NodeSelector),
				Spec:         spec,
				Stateful:     len(spec.Volumes) > 0,
				Surge:        surge,
				Source:       d.at(""),
			}
			what := fmt.Sprintf(" (replica %d of Service %s)", i, name)
			if surge {
				what = fmt.Sprintf(" (surge instance %d of Service %s)", i-svc.Replicas, name)
			}
			if !claim(rname, d.at("metadata.name"), what) {
				continue
			}
			claimVolumes(&inst, d.at, "spec.template", false)
			inst.SpecHash = statelessHash
			if inst.SpecHash == "" {
				inst.SpecHash = SpecHash(inst.Spec)
			}
			m.Instances = append(m.Instances, inst)
			if surge {
				svc.Surge = append(svc.Surge, rname)
			} else {
				svc.Instances = append(svc.Instances, rname)
			}
		}
		m.Services = append(m.Services, svc)
	}
	slices.SortFunc(m.Instances, func(a, b Instance) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(m.Services, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
}

// volumeClaim is the first instance found to name a volume: a second may
// name it too only when both are Jails pinned to the same node and give it
// the same size (a shared volume).
type volumeClaim struct {
	inst, service, node string
	unplaced            bool // see claimVolumes
	size                Bytes
}

func nodeText(node string) string {
	if node == "" {
		return "no node"
	}
	return "node " + node
}

func sizeText(b Bytes) string {
	if b == 0 {
		return "no size"
	}
	return "size " + b.String()
}

// replicas is the number of replicas d declares, 0 when that number is
// invalid (buildInstances reports it).
func replicas(d doc[serviceDoc]) int {
	switch n := d.v.Spec.Replicas; {
	case n == nil:
		return 1
	case *n < 0 || *n > maxReplicas:
		return 0
	default:
		return *n
	}
}

// declaredInstances counts the instances the repository declares: its
// Jails and every Service's replicas and surge instances.
func (r *renderer) declaredInstances() int {
	n := len(r.jails)
	for _, d := range r.services {
		n += replicas(d) + surgeInstances(d)
	}
	return n
}

// overCap reports whether the repository declares more instances than the
// cluster's cap (spec.maxInstances), and if so reports it once: at the
// replicas of the Service that crosses the cap, Jails counted first, or at
// the Jail that does. It counts before anything is expanded, so that a
// spec of a few kilobytes (a hundred Services of 10000 replicas) is
// refused in milliseconds instead of building a million instances.
func (r *renderer) overCap(m *Model) bool {
	limit, total := m.Cluster.MaxInstances, r.declaredInstances()
	if total <= limit {
		return false
	}
	const raise = "raise spec.maxInstances in " + ClusterFile
	kinds := "Jails and Service replicas"
	if slices.ContainsFunc(r.services, func(d doc[serviceDoc]) bool { return surgeInstances(d) > 0 }) {
		kinds = "Jails, Service replicas and surge instances"
	}
	if len(r.jails) > limit {
		d := r.jails[limit]
		r.diag.errorf(d.at(""), "", "this Jail brings the cluster to %d instances (%s), more than its maxInstances of %d: remove some, or %s (at most %d)", total, kinds, limit, raise, MaxInstancesLimit)
		return true
	}
	n := len(r.jails)
	for _, d := range r.services {
		reps, surge := replicas(d), surgeInstances(d)
		if n += reps + surge; n > limit {
			these, lower := fmt.Sprintf("%d replicas", reps), "replicas"
			if reps == 1 {
				these = "1 replica"
			}
			switch {
			case surge == 1:
				these, lower = these+" and 1 surge instance", "replicas or maxSurge"
			case surge > 1:
				these, lower = fmt.Sprintf("%s and %d surge instances", these, surge), "replicas or maxSurge"
			}
			verb := "bring"
			if reps == 1 && surge == 0 {
				verb = "brings"
			}
			r.diag.errorf(d.at("spec.replicas"), "spec.replicas", "%s %s the cluster to %d instances (%s), more than its maxInstances of %d: lower %s, or %s (at most %d)", these, verb, total, kinds, limit, lower, raise, MaxInstancesLimit)
			break
		}
	}
	return true
}

// placeAddress checks a Jail's explicit address and binds the Jail to the
// node whose subnet holds it. written is the address with the prefix length
// the spec gave it (invalid when written bare): that prefix must be the
// node's subnet, so that the address means on the node what it says.
func (r *renderer) placeAddress(inst *Instance, written netip.Prefix, at func(string) Position, m *Model) {
	a := inst.Spec.Network.Address.Addr
	const field = "spec.network.address"
	var owner *Node
	for i := range m.Nodes {
		if m.Nodes[i].PodCIDR.IsValid() && m.Nodes[i].PodCIDR.Contains(a) {
			owner = &m.Nodes[i]
		}
	}
	if owner == nil {
		r.diag.errorf(at(field), field, "%s is in no node's subnet; an explicit address picks its node, so it must be inside one (see keel render for the nodes' subnets)", a)
		return
	}
	switch host := a.As4()[3]; host {
	case 0, 255:
		r.diag.errorf(at(field), field, "%s is the network or broadcast address of node %s's subnet %s", a, owner.Name, owner.PodCIDR)
	case 1:
		r.diag.errorf(at(field), field, "%s is the bridge address of node %s's subnet %s (.1 is reserved)", a, owner.Name, owner.PodCIDR)
	}
	if written.IsValid() && written.Masked() != owner.PodCIDR.Prefix {
		r.diag.errorf(at(field), field, "%s: the prefix length must be that of node %s's subnet %s (write %s/%d, or the bare address %s)",
			written, owner.Name, owner.PodCIDR, a, owner.PodCIDR.Bits(), a)
	}
	if inst.Node != "" && inst.Node != owner.Name {
		r.diag.errorf(at(field), field, "%s is in node %s's subnet %s, but spec.node is %s", a, owner.Name, owner.PodCIDR, inst.Node)
		return
	}
	inst.Node = owner.Name
}

func (r *renderer) buildIngresses(m *Model) {
	seen := map[string]Position{}
	routes := map[string]string{}
	for _, d := range r.ingress {
		r.checkMetadata(d.v.Metadata, d.at)
		s := d.v.Spec
		in := Ingress{Name: d.v.Metadata.Name, Host: s.Host, Path: s.Path, Backend: Backend(s.Backend), Source: d.at("")}
		if first, dup := seen[in.Name]; dup {
			r.diag.errorf(d.at("metadata.name"), "metadata.name", "duplicate Ingress %q (also at %s)", in.Name, first)
			continue
		}
		seen[in.Name] = d.at("metadata.name")
		if msg := checkHostname(s.Host, true); msg != "" {
			r.diag.errorf(d.at("spec.host"), "spec.host", "%s", msg)
		}
		if in.Path == "" {
			in.Path = DefaultPath
		} else if !strings.HasPrefix(in.Path, "/") || strings.ContainsAny(in.Path, "?# \t") || strings.Contains(in.Path, "..") || strings.Contains(in.Path, "//") {
			r.diag.errorf(d.at("spec.path"), "spec.path", "%q is not a URL path prefix (want e.g. / or /api)", in.Path)
		}
		svc := m.Service(s.Backend.Service)
		switch {
		case s.Backend.Service == "":
			r.diag.errorf(d.at("spec.backend.service"), "spec.backend.service", "required: the Service to send requests to")
		case svc == nil:
			msg := fmt.Sprintf("Service %q does not exist", s.Backend.Service)
			var names []string
			for _, o := range m.Services {
				names = append(names, o.Name)
			}
			if sug := suggest(s.Backend.Service, names); sug != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", sug)
			}
			r.diag.errorf(d.at("spec.backend.service"), "spec.backend.service", "%s", msg)
		}
		if in.Backend.Port == 0 && svc != nil {
			in.Backend.Port = svc.Port
		} else if d.written("spec.backend.port") && (in.Backend.Port < 1 || in.Backend.Port > 65535) {
			r.diag.errorf(d.at("spec.backend.port"), "spec.backend.port", "%d is not a TCP port (1-65535)", in.Backend.Port)
		}
		if s.TLS != nil {
			in.TLS = &TLS{Email: s.TLS.Email}
			if s.TLS.Email == "" {
				r.diag.errorf(d.at("spec.tls.email"), "spec.tls.email", "required: the ACME account's contact address")
			} else if msg := checkEmail(s.TLS.Email); msg != "" {
				r.diag.errorf(d.at("spec.tls.email"), "spec.tls.email", "%s", msg)
			}
		} else {
			r.diag.warnf(d.at("spec"), "spec.tls", "no tls: %s is served over plain HTTP only", s.Host)
		}
		route := s.Host + in.Path
		if other, dup := routes[route]; dup {
			r.diag.errorf(d.at("spec.host"), "spec.host", "%s%s is also routed by Ingress %s", s.Host, in.Path, other)
		}
		routes[route] = in.Name
		m.Ingresses = append(m.Ingresses, in)
	}
	slices.SortFunc(m.Ingresses, func(a, b Ingress) int { return strings.Compare(a.Name, b.Name) })
	if slices.ContainsFunc(m.Ingresses, func(in Ingress) bool { return in.TLS != nil }) {
		for _, n := range m.IngressNodes() {
			if n.CanReceiveCertificates() {
				continue
			}
			why := "it has no reportKey"
			if n.ReportKey != "" {
				why = "its reportKey is not an ssh-ed25519 or ssh-rsa key, the kinds age encrypts to"
			}
			r.diag.warnf(n.Source, "spec.reportKey", "node %s serves Ingresses but cannot receive shared certificates (%s): it obtains its own certificate for every host it serves, within the CA's rate limits", n.Name, why)
		}
	}
}
