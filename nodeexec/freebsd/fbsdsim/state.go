package fbsdsim

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// State is the whole simulated userland: what the kernel and ZFS would
// hold on a FreeBSD host. Both modes keep exactly this value: the
// in-process Sim in memory, the executables in <root>/.fbsdsim/state.json.
// State() and Load return deep copies that tests may read freely.
type State struct {
	// Seq orders creations (ZFS createtxg, jail ids, process ids of the
	// in-process mode).
	Seq     int `json:"seq"`
	LastJID int `json:"last_jid"`
	LastPid int `json:"last_pid"`

	Datasets  map[string]*Dataset  `json:"datasets"`
	Snapshots map[string]*Snapshot `json:"snapshots"`
	// Mounts lists every mounted file system in mount order; ZFS
	// datasets appear as fstype "zfs".
	Mounts []Mount           `json:"mounts"`
	Jails  map[string]*Jail  `json:"jails"`
	Procs  []Proc            `json:"procs"`
	Ifaces []*Iface          `json:"ifaces"`
	Routes []Route           `json:"routes"`
	Rctl   []string          `json:"rctl"`
	Sysctl map[string]string `json:"sysctl"`
	PF     PF                `json:"pf"`

	// FailNext holds the injected failures not yet consumed.
	FailNext []FailRule `json:"fail_next,omitempty"`
}

// Dataset is a ZFS filesystem.
type Dataset struct {
	Name string `json:"name"`
	// Props holds the properties set locally (quota, mountpoint, ...).
	Props map[string]string `json:"props"`
	// Origin is the snapshot this dataset was cloned from, "" if none.
	Origin string `json:"origin,omitempty"`
	TXG    int    `json:"txg"`
}

// Snapshot is a ZFS snapshot; its files are kept under
// <root>/.fbsdsim/snapshots/.
type Snapshot struct {
	Name string `json:"name"`
	TXG  int    `json:"txg"`
	Dir  string `json:"dir"`
	// Props holds the user properties set on the snapshot itself (zfs
	// snapshot -o, zfs set): the only ones a snapshot can have.
	Props map[string]string `json:"props,omitempty"`
}

// Mount is one mounted file system as statfs(2) reports it.
type Mount struct {
	From   string `json:"from"`
	On     string `json:"on"`
	FSType string `json:"fstype"`
	Opts   string `json:"opts"`
}

// Jail is a prison.
type Jail struct {
	Name         string    `json:"name"`
	JID          int       `json:"jid"`
	Path         string    `json:"path"`
	VNet         bool      `json:"vnet"`
	Persist      bool      `json:"persist"`
	DevfsRuleset int       `json:"devfs_ruleset"`
	Hostname     string    `json:"hostname"`
	Created      time.Time `json:"created"`
	// Dying is set once jail -r removed a jail whose processes are not
	// all reaped yet (zombies): jls no longer shows it, but it still
	// holds its root busy (docs/freebsd-notes.md §1.7 step 4).
	Dying bool `json:"dying,omitempty"`
	// IgnoreTerm makes its processes ignore SIGTERM (test hook).
	IgnoreTerm bool `json:"ignore_term,omitempty"`
}

// Proc is a process attached to a jail.
type Proc struct {
	Pid  int      `json:"pid"`
	JID  int      `json:"jid"`
	Jail string   `json:"jail"`
	Argv []string `json:"argv"`
	// Start is when it started; StartTicks is /proc/<pid>/stat field 22
	// for a real process, so that a reused pid is never taken for it.
	Start      time.Time `json:"start"`
	StartTicks uint64    `json:"start_ticks,omitempty"`
	// Real is set for a process of the executable mode (a real pid on
	// this host); the in-process mode's processes are simulated.
	Real bool `json:"real,omitempty"`
	// Exited is set when a simulated process ended; it stays a zombie
	// (state Z) until its parent waits for it.
	Exited bool `json:"exited,omitempty"`
	Code   int  `json:"code,omitempty"`
}

// Addr is an IPv4 interface address.
type Addr struct {
	IP     string `json:"ip"`
	Prefix int    `json:"prefix"`
}

// Prefix returns the address as a netip.Prefix.
func (a Addr) prefix() netip.Prefix {
	ip, _ := netip.ParseAddr(a.IP)
	return netip.PrefixFrom(ip, a.Prefix)
}

// Iface is a network interface in one VNET.
type Iface struct {
	Name string `json:"name"`
	// VNet is the jail whose VNET holds it, "" for the host.
	VNet string `json:"vnet"`
	// Kind: loopback, ether, bridge, epair.
	Kind    string   `json:"kind"`
	Up      bool     `json:"up"`
	Addrs   []Addr   `json:"addrs"`
	Members []string `json:"members,omitempty"`
	// Peer is the other end of an epair.
	Peer string `json:"peer,omitempty"`
	// Unit is the cloner unit (bridgeN, epairN), -1 for others.
	Unit int `json:"unit"`
}

// Route is a static route in one VNET's table (connected routes come
// from interface addresses and are not stored).
type Route struct {
	VNet    string `json:"vnet"`
	Dest    string `json:"dest"` // "default" or a CIDR
	Gateway string `json:"gateway"`
	Iface   string `json:"iface"`
}

// PF is the packet filter's state.
type PF struct {
	// Loaded is false when pf.ko is not loaded (/dev/pf is missing).
	Loaded bool `json:"loaded"`
	// Disabled is pf loaded but not started (pfctl -d, or no
	// pf_enable="YES"); Since is when it was last started or stopped.
	Disabled bool      `json:"disabled"`
	Since    time.Time `json:"since"`
	// Anchors are the loaded rulesets by anchor, "" for the main one,
	// each a list of rules as loaded.
	Anchors map[string][]string `json:"anchors"`
}

// FailRule makes the next command whose argv starts with Prefix fail.
type FailRule struct {
	Prefix []string `json:"prefix"`
	Stderr string   `json:"stderr"`
	Code   int      `json:"code"`
}

func newState(o Options) *State {
	s := &State{
		Datasets:  map[string]*Dataset{},
		Snapshots: map[string]*Snapshot{},
		Jails:     map[string]*Jail{},
		Sysctl: map[string]string{
			"hw.ncpu":                o.NCPU,
			"hw.physmem":             o.PhysMem,
			"hw.pagesize":            "4096",
			"kern.racct.enable":      o.Racct,
			"kern.ostype":            "FreeBSD",
			"kern.osrelease":         "14.2-RELEASE",
			"kern.hostname":          o.Hostname,
			"net.inet.ip.forwarding": o.Forwarding,
			"net.fibs":               "1",
			"security.jail.jailed":   "0",
			// GENERIC has options VIMAGE (kern.features.vimage).
			"kern.features.vimage": "1",
		},
		PF: PF{Loaded: !o.NoPF, Since: time.Now(), Anchors: map[string][]string{}},
	}
	s.Ifaces = append(s.Ifaces, &Iface{Name: "lo0", Kind: "loopback", Up: true, Unit: -1,
		Addrs: []Addr{{IP: "127.0.0.1", Prefix: 8}}})
	for _, pi := range o.HostIfaces {
		s.Ifaces = append(s.Ifaces, &Iface{Name: pi.Name, Kind: "ether", Up: true, Unit: -1, Addrs: slices.Clone(pi.Addrs)})
	}
	for _, p := range o.Pools {
		s.Seq++
		s.Datasets[p] = &Dataset{Name: p, Props: map[string]string{}, TXG: s.Seq}
		s.Mounts = append(s.Mounts, Mount{From: p, On: "/" + p, FSType: "zfs", Opts: zfsOpts})
	}
	return s
}

func (s *State) clone() *State {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	var c State
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return &c
}

// Expect says what a test expects to exist; everything else that Keel
// could have created is a leak.
type Expect struct {
	// Jails are the jail names expected alive.
	Jails []string
	// VIPs are the /32 aliases expected on host interfaces.
	VIPs []string
	// Routes are the destinations (CIDR) of host static routes expected.
	Routes []string
}

// Leaks lists what is left over when only the given jails should exist:
// see LeaksExpect.
func (s *State) Leaks(jails ...string) []string {
	return s.LeaksExpect(Expect{Jails: jails})
}

// LeaksExpect lists, one line each, anything left over: a jail not
// expected (or a dying one), a process outside the expected jails, an
// epair not attached to an expected jail, a cloned dataset (jail root)
// that is no expected jail's root, a nullfs or devfs mount outside the
// expected jails' roots, a /32 alias not in VIPs, a host static route not
// in Routes, a static route or rctl rule of a jail not expected, an image
// dataset (<pool>/keel/images/<hex>) without its @keel snapshot. Volume
// datasets, whole images and the bridge with its /24 gateway aliases are
// never leaks: Keel keeps them by design.
func (s *State) LeaksExpect(e Expect) []string {
	var out []string
	want := map[string]bool{}
	roots := map[string]bool{}
	for _, n := range e.Jails {
		want[n] = true
		if j := s.Jails[n]; j != nil && !j.Dying {
			roots[j.Path] = true
		}
	}
	for _, n := range e.Jails {
		if j := s.Jails[n]; j == nil || j.Dying {
			out = append(out, fmt.Sprintf("jail %s: expected but missing", n))
		}
	}
	for _, n := range sortedKeys(s.Jails) {
		j := s.Jails[n]
		switch {
		case j.Dying:
			out = append(out, fmt.Sprintf("jail %s: dying (unreaped processes)", n))
		case !want[n]:
			out = append(out, fmt.Sprintf("jail %s: not expected", n))
		}
	}
	for _, p := range s.Procs {
		if !want[p.Jail] {
			out = append(out, fmt.Sprintf("process %d (%s) in jail %s", p.Pid, strings.Join(p.Argv, " "), p.Jail))
		}
	}
	for _, i := range s.Ifaces {
		if i.Kind != "epair" || !strings.HasSuffix(i.Name, "a") {
			continue
		}
		b := s.iface(i.Peer)
		if b == nil || b.VNet == "" || !want[b.VNet] {
			out = append(out, fmt.Sprintf("epair %s: no expected jail holds %s", i.Name, i.Peer))
		}
	}
	for _, n := range sortedKeys(s.Datasets) {
		d := s.Datasets[n]
		if d.Origin == "" {
			continue
		}
		if mp := s.mountpoint(n); !roots[mp] {
			out = append(out, fmt.Sprintf("dataset %s: clone at %s is no expected jail's root", n, mp))
		}
	}
	for _, n := range sortedKeys(s.Datasets) {
		if pool, rest, ok := strings.Cut(n, "/keel/images/"); ok && !strings.Contains(pool, "/") && !strings.Contains(rest, "/") && s.Snapshots[n+"@keel"] == nil {
			out = append(out, fmt.Sprintf("dataset %s: an image without its @keel snapshot (an unpacking cut short)", n))
		}
	}
	for _, m := range s.Mounts {
		if m.FSType == "zfs" {
			continue
		}
		ok := false
		for r := range roots {
			if under(m.On, r) {
				ok = true
			}
		}
		if !ok {
			out = append(out, fmt.Sprintf("mount %s on %s (%s): outside the expected jails", m.From, m.On, m.FSType))
		}
	}
	vips := map[string]bool{}
	for _, v := range e.VIPs {
		vips[v] = true
	}
	routes := map[string]bool{}
	for _, r := range e.Routes {
		routes[r] = true
	}
	for _, i := range s.Ifaces {
		if i.VNet != "" {
			continue
		}
		for _, a := range i.Addrs {
			if a.Prefix == 32 && !vips[a.IP] {
				out = append(out, fmt.Sprintf("alias %s/32 on %s: not an expected VIP", a.IP, i.Name))
			}
		}
	}
	for _, r := range s.Routes {
		switch {
		case r.VNet == "" && !routes[r.Dest]:
			out = append(out, fmt.Sprintf("route %s via %s: not expected", r.Dest, r.Gateway))
		case r.VNet != "" && !want[r.VNet]:
			out = append(out, fmt.Sprintf("route %s via %s in jail %s: jail not expected", r.Dest, r.Gateway, r.VNet))
		}
	}
	for _, r := range s.Rctl {
		f := strings.SplitN(r, ":", 3)
		if len(f) >= 2 && f[0] == "jail" && !want[f[1]] {
			out = append(out, fmt.Sprintf("rctl rule %s: jail not expected", r))
		}
	}
	return out
}

// Jail returns the live (not dying) jail of that name, or nil.
func (s *State) Jail(name string) *Jail {
	if j := s.Jails[name]; j != nil && !j.Dying {
		return j
	}
	return nil
}

// Iface returns the interface of that name in the given VNET ("" for
// the host), or nil.
func (s *State) Iface(vnet, name string) *Iface {
	for _, i := range s.Ifaces {
		if i.VNet == vnet && i.Name == name {
			return i
		}
	}
	return nil
}

// iface finds an interface by name in any VNET (cloned names are unique
// across VNETs; lo0 is not, callers never ask for it here).
func (s *State) iface(name string) *Iface {
	for _, i := range s.Ifaces {
		if i.Name == name && i.Kind != "loopback" {
			return i
		}
	}
	return nil
}

// Mountpoint returns where a dataset is (or would be) mounted.
func (s *State) Mountpoint(name string) string { return s.mountpoint(name) }

func (s *State) mountpoint(name string) string {
	if d := s.Datasets[name]; d != nil {
		if mp, ok := d.Props["mountpoint"]; ok {
			return mp
		}
	}
	i := strings.LastIndex(name, "/")
	if i < 0 {
		return "/" + name
	}
	return s.mountpoint(name[:i]) + "/" + name[i+1:]
}

func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// zfsOpts is what mount -p shows for a ZFS dataset on FreeBSD (flags2opts
// in sbin/mount/mount.c renders MNT_NFS4ACLS as "nfsv4acls").
const zfsOpts = "rw,nfsv4acls"
