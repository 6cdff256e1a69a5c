package render

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Render reads the cluster repository in fsys and returns its model. When
// the repository has errors, the error is an *InvalidError listing all of
// them, and the partial model is still returned so that callers can show
// the warnings too. Any other error is an I/O failure.
//
// A directory without cluster.yaml (or cluster.yml) at its root is not a
// cluster repository: Render then reads nothing else and returns one error,
// rather than reporting every YAML file of whatever tree it was pointed at.
//
// What is rendered is exactly what ReadFiles returns: a file it refuses
// (a link, a FIFO, a file too large, an invalid tree) makes the repository
// invalid, with one error naming the path.
func Render(fsys fs.FS) (*Model, error) {
	files, err := ReadFiles(fsys)
	if err != nil {
		var ie *InvalidError
		if errors.As(err, &ie) {
			return &Model{Diagnostics: ie.Diagnostics}, err
		}
		return nil, err
	}
	return RenderFiles(files)
}

// RenderFiles renders the files ReadFiles returned. Its error, when not
// nil, is an *InvalidError, returned with the partial model.
func RenderFiles(files []File) (*Model, error) {
	r := &renderer{unread: map[string]bool{}}
	for _, f := range files {
		switch f.Path {
		case IgnoreFile:
		case LockFile:
			r.lock, r.lockDec = parseLock(f.Data, &r.diag)
			r.hasLock = true
		default:
			for _, d := range r.documents(f.Path, f.Data) {
				r.add(d)
			}
		}
	}
	m := r.build()
	m.Diagnostics = dropTypoEchoes(r.diag.diags).Sort()
	if errs := m.Diagnostics.Errors(); len(errs) > 0 {
		return m, &InvalidError{Diagnostics: errs}
	}
	return m, nil
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// isClusterRepo reports whether fsys has a Cluster file at its root. It
// looks at the names only: a cluster.yaml that is a link is refused when
// the files are read.
func isClusterRepo(fsys fs.FS) (bool, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		if n := e.Name(); n == ClusterFile || n == "cluster.yml" {
			return true, nil
		}
	}
	return false, nil
}

// documents splits file into its documents. A YAML syntax error gets the
// position of the offending character (see yamlSyntaxError), and a file
// whose documents could not all be read is remembered in r.unread.
func (r *renderer) documents(file string, data []byte) []rawDoc {
	var diag diagnoser
	docs := splitDocuments(file, data, &diag)
	for _, d := range diag.diags {
		if d.Severity == SeverityError {
			r.unread[file] = true
		}
		if strings.HasPrefix(d.Message, "invalid YAML: ") && d.Field == "" {
			if pos, msg, ok := yamlSyntaxError(file, data); ok {
				d.Pos, d.Message = pos, msg
			}
		}
		r.diag.diags = append(r.diag.diags, d)
	}
	return docs
}

// doc is a decoded document with the positions of its fields.
type doc[T any] struct {
	v   T
	dec *decoder
}

func (d doc[T]) at(field string) Position { return d.dec.at(field) }

// written reports whether the document gave field a value. An empty value
// (key:, ~, null) counts as not written.
func (d doc[T]) written(field string) bool {
	_, ok := d.dec.pos[field]
	return ok && !d.dec.empty[field]
}

type renderer struct {
	diag diagnoser
	// unread holds the files with a document that could not be read (bad
	// YAML, not a Keel document, nested too deeply). Its one error says
	// so; a Cluster missing because of it is not reported again.
	unread   map[string]bool
	clusters []doc[clusterDoc]
	nodes    []doc[nodeDoc]
	jails    []doc[jailDoc]
	services []doc[serviceDoc]
	ingress  []doc[ingressDoc]
	lock     Lock
	lockDec  *decoder
	hasLock  bool
}

// addDoc decodes d and appends it to docs, unless it was refused whole.
func addDoc[T any](r *renderer, docs *[]doc[T], d rawDoc) {
	dec := &decoder{file: d.file, diag: &r.diag, pos: map[string]Position{}}
	var v T
	dec.decodeDocument(d.node, reflect.ValueOf(&v).Elem())
	if dec.refused {
		r.unread[d.file] = true
		return
	}
	*docs = append(*docs, doc[T]{v: v, dec: dec})
}

func (r *renderer) add(d rawDoc) {
	switch d.kind {
	case KindCluster:
		addDoc(r, &r.clusters, d)
	case KindNode:
		addDoc(r, &r.nodes, d)
	case KindJail:
		addDoc(r, &r.jails, d)
	case KindService:
		addDoc(r, &r.services, d)
	case KindIngress:
		addDoc(r, &r.ingress, d)
	}
}

func (r *renderer) build() *Model {
	m := &Model{Lock: r.lock}
	r.buildCluster(m)
	r.buildNodes(m)
	r.allocateSubnets(m)
	r.buildInstances(m)
	r.allocateVIPs(m)
	r.buildIngresses(m)
	r.checkLock(m)
	r.bindInstances(m)
	return m
}

// bindInstances fills in, for display and for the planner's convenience,
// each instance's Service VIP, its pin, and its node's subnet when the node
// is already decided.
func (r *renderer) bindInstances(m *Model) {
	for i := range m.Instances {
		inst := &m.Instances[i]
		if svc := m.Service(inst.Service); svc != nil {
			inst.VIP = svc.VIP
		}
		node := inst.Node
		if pin, ok := r.lock.Pins[inst.Name]; ok && inst.Stateful {
			inst.Pin = pin
			node = cmp.Or(node, pin)
		}
		if n := m.Node(node); n != nil {
			inst.NodeSubnet = n.PodCIDR
		}
	}
}

func (r *renderer) checkMetadata(md Metadata, at func(string) Position) {
	if msg := checkName(md.Name); msg != "" {
		r.diag.errorf(at("metadata.name"), "metadata.name", "%s", msg)
	}
	r.checkLabels(md.Labels, "metadata.labels", at)
}

func (r *renderer) checkLabels(labels map[string]string, field string, at func(string) Position) {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		f := field + "." + k
		if msg := checkLabelKey(k); msg != "" {
			r.diag.errorf(at(f+"#key"), f, "%s", msg)
		}
		if msg := checkLabelValue(labels[k]); msg != "" {
			r.diag.errorf(at(f), f, "%s", msg)
		}
	}
}

func (r *renderer) buildCluster(m *Model) {
	c := Cluster{
		PodCIDR:         Prefix{DefaultPodCIDR},
		ServiceCIDR:     Prefix{DefaultServiceCIDR},
		Bridge:          DefaultBridge,
		Pool:            DefaultPool,
		LivenessTTL:     DefaultLivenessTTL,
		ReportInterval:  DefaultReportInterval,
		ReportRefPrefix: DefaultReportRefPrefix,
		MaxInstances:    DefaultMaxInstances,
	}
	if len(r.clusters) == 0 {
		if !r.unread[ClusterFile] && !r.unread["cluster.yml"] {
			r.diag.errorf(Position{File: ClusterFile}, "", "missing: a cluster repository has one Cluster document in %s at its root (is --repo the right directory?)", ClusterFile)
		}
		m.Cluster = c
		return
	}
	// The document in cluster.yaml is the Cluster; any other is the extra one.
	slices.SortStableFunc(r.clusters, func(a, b doc[clusterDoc]) int {
		return cmp.Compare(rootRank(a.dec.file), rootRank(b.dec.file))
	})
	for _, extra := range r.clusters[1:] {
		r.diag.errorf(extra.at(""), "kind", "a second Cluster document (the first is at %s); a repository has exactly one", r.clusters[0].at(""))
	}
	d := r.clusters[0]
	if d.dec.file != ClusterFile && d.dec.file != "cluster.yml" {
		r.diag.errorf(d.at("kind"), "kind", "the Cluster document belongs in %s at the repository root", ClusterFile)
	}
	r.checkMetadata(d.v.Metadata, d.at)
	s := d.v.Spec
	c.Name = d.v.Metadata.Name
	if s.PodCIDR.IsValid() {
		c.PodCIDR = s.PodCIDR
	}
	if s.ServiceCIDR.IsValid() {
		c.ServiceCIDR = s.ServiceCIDR
	}
	c.Bridge = cmp.Or(s.Bridge, c.Bridge)
	c.Pool = cmp.Or(s.Pool, c.Pool)
	if g := s.Gossip; g != nil {
		c.Gossip = &Gossip{Port: g.Port}
		if g.Port < 1 || g.Port > 65535 {
			r.diag.errorf(d.at("spec.gossip.port"), "spec.gossip.port", "%d is not a port (1-65535): the gossip ring needs one", g.Port)
		}
		c.ReportInterval = GossipReportInterval(len(r.nodes))
		c.LivenessTTL = 3 * c.ReportInterval
	}
	c.LivenessTTL = cmp.Or(s.LivenessTTL, c.LivenessTTL)
	c.ReportInterval = cmp.Or(s.ReportInterval, c.ReportInterval)
	c.ReportRefPrefix = cmp.Or(s.ReportRefPrefix, c.ReportRefPrefix)
	c.ReportRepo = s.ReportRepo
	c.Suspend = s.Suspend
	c.AllowEmpty = s.AllowEmpty
	c.MinAgentVersion = s.MinAgentVersion
	if s.MaxInstances != 0 {
		if s.MaxInstances < 1 || s.MaxInstances > MaxInstancesLimit {
			r.diag.errorf(d.at("spec.maxInstances"), "spec.maxInstances", "%d is not an instance cap (1-%d)", s.MaxInstances, MaxInstancesLimit)
		} else {
			c.MaxInstances = s.MaxInstances
		}
	}
	m.Cluster = c

	if c.PodCIDR.Bits() > 24 {
		r.diag.errorf(d.at("spec.podCIDR"), "spec.podCIDR", "%s is too small: each node gets a /24 of it, so it must be a /24 or larger", c.PodCIDR)
	}
	if c.ServiceCIDR.Bits() > 30 {
		r.diag.errorf(d.at("spec.serviceCIDR"), "spec.serviceCIDR", "%s is too small for service VIPs (want a /30 or larger)", c.ServiceCIDR)
	}
	if c.PodCIDR.Overlaps(c.ServiceCIDR.Prefix) {
		r.diag.errorf(d.at("spec.serviceCIDR"), "spec.serviceCIDR", "%s overlaps podCIDR %s", c.ServiceCIDR, c.PodCIDR)
	}
	if !bridgeName.MatchString(c.Bridge) {
		r.diag.errorf(d.at("spec.bridge"), "spec.bridge", "%q is not a Keel bridge name (want keel<N>, e.g. keel0)", c.Bridge)
	}
	if !poolName.MatchString(c.Pool) || len(c.Pool) > 200 {
		r.diag.errorf(d.at("spec.pool"), "spec.pool", "%q is not a ZFS pool name", c.Pool)
	}
	if c.ReportInterval*3 > c.LivenessTTL {
		r.diag.errorf(d.at("spec.reportInterval"), "spec.reportInterval", "%s is more than a third of livenessTTL %s: a node would look dead between two reports", c.ReportInterval, c.LivenessTTL)
	}
	if msg := checkRefPrefix(c.ReportRefPrefix); msg != "" {
		r.diag.errorf(d.at("spec.reportRefPrefix"), "spec.reportRefPrefix", "%s", msg)
	}
	if c.ReportRepo != "" {
		if u, err := url.Parse(c.ReportRepo); err == nil && u.User != nil && u.Scheme != "ssh" {
			r.diag.errorf(d.at("spec.reportRepo"), "spec.reportRepo", "must not carry credentials: agents read them from files given on their command line")
		} else if strings.ContainsAny(c.ReportRepo, " \t\n") {
			r.diag.errorf(d.at("spec.reportRepo"), "spec.reportRepo", "%q is not a repository URL", c.ReportRepo)
		}
	}
	if c.MinAgentVersion != "" && !semver.MatchString(c.MinAgentVersion) {
		r.diag.errorf(d.at("spec.minAgentVersion"), "spec.minAgentVersion", "%q is not a version (want e.g. 0.3.0)", c.MinAgentVersion)
	}
}

func rootRank(file string) int {
	if file == ClusterFile || file == "cluster.yml" {
		return 0
	}
	return 1
}

// checkRefPrefix validates where reports live: outside refs/heads/ and
// refs/tags/ so that no forge treats a report push as a branch or a release.
func checkRefPrefix(p string) string {
	switch {
	case !strings.HasPrefix(p, "refs/") || !strings.HasSuffix(p, "/"):
		return fmt.Sprintf("%q must start with refs/ and end with /", p)
	case strings.HasPrefix(p, "refs/heads/") || strings.HasPrefix(p, "refs/tags/"):
		return fmt.Sprintf("%q would make reports branches or tags; use a namespace such as refs/keel/reports/", p)
	case strings.HasPrefix(p, CertRefPrefix) || strings.HasPrefix(CertRefPrefix, p):
		return fmt.Sprintf("%q overlaps %s, where the shared certificates are published: use a namespace such as refs/keel/reports/", p, CertRefPrefix)
	case strings.Contains(p, "..") || strings.Contains(p, "//") || strings.ContainsAny(p, " ~^:?*[\\\t\n") || strings.Contains(p, "@{"):
		return fmt.Sprintf("%q is not a valid git ref prefix", p)
	}
	return ""
}

func (r *renderer) buildNodes(m *Model) {
	seen := map[string]Position{}
	addrs := map[Addr]string{}
	podAt := map[string]Position{} // node → where its spec.podCIDR is written
	for _, d := range r.nodes {
		r.checkMetadata(d.v.Metadata, d.at)
		name := d.v.Metadata.Name
		file := d.dec.file
		if dir, base := path.Split(file); dir != NodesDir+"/" || strings.TrimSuffix(base, path.Ext(base)) != name {
			r.diag.errorf(d.at("metadata.name"), "metadata.name", "node %q belongs in %s/%s.yaml (one file per node, named after it)", name, NodesDir, name)
		}
		if first, dup := seen[name]; dup && name != "" {
			r.diag.errorf(d.at("metadata.name"), "metadata.name", "duplicate node %q (also at %s)", name, first)
			continue
		}
		seen[name] = d.at("metadata.name")
		s := d.v.Spec
		n := Node{
			Name:        name,
			Labels:      d.v.Metadata.Labels,
			Address:     s.Address,
			PodCIDR:     s.PodCIDR,
			Schedulable: s.Schedulable == nil || *s.Schedulable,
			ReportKey:   s.ReportKey,
			Source:      d.at(""),
		}
		if s.PodCIDR.IsValid() {
			n.PodCIDRSource = SourceExplicit
			podAt[name] = d.at("spec.podCIDR")
		}
		switch {
		case !s.Address.IsValid():
			if !d.written("spec.address") {
				r.diag.errorf(d.at("spec.address"), "spec.address", "required: the address other nodes route this node's subnet to")
			}
		case m.Cluster.PodCIDR.Contains(s.Address.Addr) || m.Cluster.ServiceCIDR.Contains(s.Address.Addr):
			r.diag.errorf(d.at("spec.address"), "spec.address", "%s is inside the cluster's podCIDR or serviceCIDR; a node's address is its own host address", s.Address)
		default:
			if other, dup := addrs[s.Address]; dup {
				r.diag.errorf(d.at("spec.address"), "spec.address", "%s is also the address of node %s", s.Address, other)
			}
			addrs[s.Address] = name
		}
		if s.PodCIDR.IsValid() {
			switch {
			case s.PodCIDR.Bits() != 24:
				r.diag.errorf(d.at("spec.podCIDR"), "spec.podCIDR", "%s: a node's subnet is a /24", s.PodCIDR)
			case !m.Cluster.PodCIDR.Contains(s.PodCIDR.Addr()) || m.Cluster.PodCIDR.Bits() > 24:
				r.diag.errorf(d.at("spec.podCIDR"), "spec.podCIDR", "%s is outside the cluster's podCIDR %s", s.PodCIDR, m.Cluster.PodCIDR)
			}
		}
		if s.Capacity != nil {
			n.Capacity = &Resources{CPU: s.Capacity.CPU, Memory: s.Capacity.Memory}
		}
		if s.ReportKey != "" {
			if msg := checkSSHPublicKey(s.ReportKey); msg != "" {
				r.diag.errorf(d.at("spec.reportKey"), "spec.reportKey", "%s", msg)
			}
		} else if name != "" {
			r.diag.warnf(d.at("metadata.name"), "spec.reportKey", "node %s has no reportKey: its reports are not signed, so whoever can push refs/keel/reports/%s can speak for it", name, name)
		}
		m.Nodes = append(m.Nodes, n)
	}
	slices.SortFunc(m.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range m.Nodes {
		for j := i + 1; j < len(m.Nodes); j++ {
			a, b := m.Nodes[i], m.Nodes[j]
			if a.PodCIDRSource == SourceExplicit && b.PodCIDRSource == SourceExplicit && a.PodCIDR.Overlaps(b.PodCIDR.Prefix) {
				r.diag.errorf(podAt[b.Name], "spec.podCIDR", "%s overlaps node %s's podCIDR %s", b.PodCIDR, a.Name, a.PodCIDR)
			}
		}
	}
	if len(r.nodes) == 0 {
		r.diag.warnf(Position{File: NodesDir}, "", "the inventory is empty: add nodes/<name>.yaml for each node")
	}
}

// sshKeyTypes are the public key algorithms a reportKey may use.
// Hardware (sk-) keys are not among them: an agent signs its reports
// unattended, which a security key cannot do.
var sshKeyTypes = []string{"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"}

// checkSSHPublicKey checks the shape of an authorized_keys-style public key:
// "<type> <base64 blob> [comment]", the blob naming the same type. The key
// itself is parsed by the code that verifies signatures.
func checkSSHPublicKey(k string) string {
	fields := strings.Fields(k)
	bad := "not an SSH public key (want the line of a .pub file, e.g. ssh-ed25519 AAAA... node@host)"
	if len(fields) < 2 || !slices.Contains(sshKeyTypes, fields[0]) {
		return bad
	}
	blob, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(blob) < 4 {
		return bad
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) || string(blob[4:4+n]) != fields[0] {
		return bad
	}
	return ""
}

var didYouMean = regexp.MustCompile(`^unknown field "[^"]*" \(did you mean "([^"]+)"\?\)$`)

// dropTypoEchoes removes the "required" error of a field whose name was
// misspelled: "imgae" (did you mean "image"?) says all there is to say.
func dropTypoEchoes(ds Diagnostics) Diagnostics {
	typo := map[string]bool{}
	for _, d := range ds {
		if m := didYouMean.FindStringSubmatch(d.Message); m != nil {
			parent := d.Field[:max(strings.LastIndex(d.Field, "."), 0)]
			typo[d.Pos.File+"\x00"+join(parent, m[1])] = true
		}
	}
	out := ds[:0:0]
	for _, d := range ds {
		if typo[d.Pos.File+"\x00"+d.Field] && strings.Contains(d.Message, "required") {
			continue
		}
		out = append(out, d)
	}
	return out
}
