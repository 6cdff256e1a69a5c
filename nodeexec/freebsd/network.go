package freebsd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
)

func epairA(n int) string { return "epair" + strconv.Itoa(n) + "a" }
func epairB(n int) string { return "epair" + strconv.Itoa(n) + "b" }

// maxEpairProbe bounds the ordinals skipped because an interface of that
// name exists (another tool's epair).
const maxEpairProbe = 1000

// ifaceExists runs `ifconfig <if>`: exit 0 means it exists
// (docs/freebsd-notes.md §4.1); "interface <if> does not exist" that it
// does not (sbin/ifconfig/ifconfig.c).
func (d *Driver) ifaceExists(ctx context.Context, iface string) (bool, error) {
	res, err := d.run(ctx, "ifconfig", iface)
	if err != nil {
		return false, err
	}
	if res.Code == 0 {
		return true, nil
	}
	e := &cmdError{argv: []string{"ifconfig", iface}, code: res.Code, stderr: string(res.Stderr)}
	if e.has(msgNoInterface...) {
		return false, nil
	}
	return false, e
}

// clonedBridge is what `ifconfig bridge create` prints: the new bridge's
// name (sbin/ifconfig/ifclone.c ifclonecreate prints the name the kernel
// gave back when it differs from the one asked for).
var clonedBridge = regexp.MustCompile(`^bridge[0-9]+$`)

// ensureBridgeLocked creates the bridge when it does not exist, and never
// destroys it (docs/freebsd-notes.md §4.1): `ifconfig bridge create`, a
// rename to the Keel name, up. d.netMu is held.
func (d *Driver) ensureBridgeLocked(ctx context.Context, bridge string) error {
	ok, err := d.ifaceExists(ctx, bridge)
	if err != nil || ok {
		return err
	}
	out, err := d.must(ctx, "ifconfig", "bridge", "create")
	if err != nil {
		return err
	}
	made := strings.TrimSpace(string(out))
	if !clonedBridge.MatchString(made) {
		return fmt.Errorf("ifconfig bridge create printed %q, not a bridge's name", made)
	}
	if _, err := d.must(ctx, "ifconfig", made, "name", bridge); err != nil {
		// The bridge is Keel's own, just made: do not leave it about.
		if _, derr := d.must(ctx, "ifconfig", made, "destroy"); derr != nil {
			d.log.Warn("removing a bridge that could not be renamed", "bridge", made, "err", derr)
		}
		return err
	}
	_, err = d.must(ctx, "ifconfig", bridge, "up")
	return err
}

// aliasIndexLocked returns the index of a recorded alias, or -1.
func (d *Driver) aliasIndexLocked(iface, addr string) int {
	return slices.IndexFunc(d.net.Aliases, func(a aliasRecord) bool { return a.Iface == iface && a.Addr == addr })
}

// addAliasLocked adds an address to an interface and records it, unless
// the record says Keel added it already (so a pass that changes nothing
// runs nothing). The record is written before the command, marked
// pending: a crash in between leaves an entry that the next call completes.
// An address that exists though Keel never meant to add it is not Keel's:
// it is left out of the record, so it is never removed. d.netMu is held.
//
// Whether the address exists is asked first (`ifconfig <iface>`): an agent
// killed after its add ran and before the record was completed finds the
// address there on its retry and must know that it was not there before,
// or it would take the operator's address for its own and remove it later.
func (d *Driver) addAliasLocked(ctx context.Context, a aliasRecord, argv ...string) error {
	i := d.aliasIndexLocked(a.Iface, a.Addr)
	if i >= 0 && !d.net.Aliases[i].Pending {
		return nil
	}
	wasPending := i >= 0
	if !wasPending {
		out, err := d.must(ctx, "ifconfig", a.Iface)
		if err != nil {
			return err
		}
		addr, _, _ := strings.Cut(a.Addr, "/")
		if hasInet(out, addr) {
			d.log.Info("an address Keel wants exists already; it is not Keel's and will be left alone", "iface", a.Iface, "addr", a.Addr)
			return nil
		}
		a.Pending = true
		d.net.Aliases = append(d.net.Aliases, a)
		if err := d.saveNetLocked(); err != nil {
			return err
		}
	}
	already, err := d.tolerate(ctx, msgExists, argv...)
	i = d.aliasIndexLocked(a.Iface, a.Addr)
	switch {
	case err != nil || already && !wasPending:
		if already {
			d.log.Info("an address Keel wants exists already; it is not Keel's and will be left alone", "iface", a.Iface, "addr", a.Addr)
		}
		d.net.Aliases = slices.Delete(d.net.Aliases, i, i+1)
	default:
		d.net.Aliases[i].Pending = false
	}
	if serr := d.saveNetLocked(); err == nil {
		err = serr
	}
	return err
}

// removeAliasLocked removes an address Keel recorded adding, an absent one
// being removed already (docs/freebsd-notes.md §4.6), then forgets it.
// d.netMu is held.
func (d *Driver) removeAliasLocked(ctx context.Context, a aliasRecord) error {
	addr, _, _ := strings.Cut(a.Addr, "/")
	if _, err := d.tolerate(ctx, msgNoAddress, "ifconfig", a.Iface, "-alias", addr); err != nil {
		return err
	}
	if i := d.aliasIndexLocked(a.Iface, a.Addr); i >= 0 {
		d.net.Aliases = slices.Delete(d.net.Aliases, i, i+1)
	}
	return d.saveNetLocked()
}

// gateway is the node's address on a jail subnet: the subnet's first
// address, with the subnet's prefix (docs/freebsd-notes.md §4.2).
func gateway(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Masked().Addr().Next(), p.Bits())
}

// attach connects a vnet jail to its bridge (docs/freebsd-notes.md §4.2):
// the bridge, the subnet's gateway as an alias on it (`alias`: a plain
// address would replace the bridge's first one, §4.3), an epair whose
// a-end joins the bridge and whose b-end moves into the jail, the jail's
// address on it and its default route through the gateway. The epair's
// ordinal is recorded before the epair exists, and is never one in use:
// ordinals only grow, and one whose interface exists is skipped. Every step
// may be run again.
func (d *Driver) attach(ctx context.Context, spec nodeexec.InstanceSpec, rec *instanceRecord) error {
	bridge, addr, err := d.jailNet(spec)
	if err != nil {
		return err
	}
	gw := gateway(addr)
	jail := jailName(spec.Name)
	for attempt := 1; ; attempt++ {
		d.netMu.Lock()
		fresh, err := d.attachLocked(ctx, bridge, addr, gw, rec)
		d.netMu.Unlock()
		if err != nil {
			return err
		}
		exists := false // a fresh ordinal was just found free
		if !fresh {
			if exists, err = d.ifaceExists(ctx, epairA(rec.Epair)); err != nil {
				return err
			}
		}
		if exists {
			break
		}
		// Creates epair<N>a and epair<N>b (sbin/ifconfig/ifclone.c). A
		// fresh ordinal's "already exists" is another tool's epair made
		// since the probe: never Keel's to move into a jail or destroy,
		// so the ordinal is given up for the next free one.
		already, err := d.tolerate(ctx, msgExists, "ifconfig", "epair"+strconv.Itoa(rec.Epair), "create")
		if err != nil {
			return err
		}
		if !already || !fresh {
			break
		}
		d.log.Warn("an epair Keel was about to create was made by someone else; taking another", "epair", epairA(rec.Epair))
		rec.Epair = 0
		if err := d.saveRecord(rec); err != nil {
			return err
		}
		if attempt == 3 {
			return errors.New("epairs are being created by someone else as fast as Keel finds free ordinals")
		}
	}
	a, b := epairA(rec.Epair), epairB(rec.Epair)
	if _, err := d.tolerate(ctx, msgExists, "ifconfig", bridge, "addm", a); err != nil {
		return err
	}
	if _, err := d.must(ctx, "ifconfig", a, "up"); err != nil {
		return err
	}
	if _, err := d.must(ctx, "ifconfig", b, "vnet", jail); err != nil {
		// An earlier attempt may have moved it already.
		res, rerr := d.run(ctx, "jexec", jail, "/sbin/ifconfig", b)
		if rerr != nil || res.Code != 0 {
			return err
		}
	}
	// Again on a restart: "File exists" (docs/freebsd-notes.md §10.13).
	if _, err := d.tolerate(ctx, msgExists, "jexec", jail, "/sbin/ifconfig", b, "inet", addr.String()); err != nil {
		return err
	}
	if _, err := d.must(ctx, "jexec", jail, "/sbin/ifconfig", b, "up"); err != nil {
		return err
	}
	_, err = d.tolerate(ctx, msgExists, "jexec", jail, "/sbin/route", "add", "default", gw.Addr().String())
	return err
}

// attachLocked does the node-wide part of attach under d.netMu: the
// instance's record (bridge, address, epair ordinal) first, so that a
// concurrent Destroy of the subnet's last other jail keeps the gateway,
// then the bridge and the gateway alias. fresh reports whether the epair
// ordinal was allocated now (its interface was just seen not to exist).
func (d *Driver) attachLocked(ctx context.Context, bridge string, addr, gw netip.Prefix, rec *instanceRecord) (fresh bool, err error) {
	if rec.Epair == 0 {
		fresh = true
		n := d.net.NextEpair
		for ; ; n++ {
			if n >= d.net.NextEpair+maxEpairProbe {
				return false, fmt.Errorf("no free epair ordinal from %d to %d", d.net.NextEpair, n)
			}
			exists, err := d.ifaceExists(ctx, epairA(n))
			if err != nil {
				return false, err
			}
			if !exists {
				break
			}
		}
		d.net.NextEpair = n + 1
		if err := d.saveNetLocked(); err != nil {
			return false, err
		}
		rec.Epair = n
	}
	rec.Bridge, rec.Address = bridge, addr.String()
	if err := d.saveRecord(rec); err != nil {
		return false, err
	}
	if err := d.ensureBridgeLocked(ctx, bridge); err != nil {
		return false, err
	}
	return fresh, d.addAliasLocked(ctx, aliasRecord{Iface: bridge, Addr: gw.String()},
		"ifconfig", bridge, "inet", gw.String(), "alias")
}

// releaseGateway removes the gateway alias of a destroyed instance's
// subnet when Keel added it and no other instance is on that subnet.
func (d *Driver) releaseGateway(ctx context.Context, rec *instanceRecord) error {
	addr, err := netip.ParsePrefix(rec.Address)
	if err != nil {
		return nil // not an address Keel wrote: nothing of it to remove
	}
	gw := gateway(addr)
	d.netMu.Lock()
	defer d.netMu.Unlock()
	d.mu.Lock()
	used := false
	for name, r := range d.records {
		if name == rec.Instance || r.Bridge != rec.Bridge {
			continue
		}
		if p, err := netip.ParsePrefix(r.Address); err == nil && gateway(p) == gw {
			used = true
		}
	}
	d.mu.Unlock()
	i := d.aliasIndexLocked(rec.Bridge, gw.String())
	if used || i < 0 || d.net.Aliases[i].VIP {
		return nil
	}
	return d.removeAliasLocked(ctx, d.net.Aliases[i])
}

// SetVIPs implements nodeexec.Network: each VIP is a /32 alias on the
// node's bridge, `ifconfig <bridge> alias <vip> netmask 255.255.255.255`
// (never a classful default: docs/freebsd-notes.md §4.6, §10.14), and VIPs
// no longer wanted are removed with `-alias`. Only aliases Keel recorded
// adding are ever removed; a VIP already present on the bridge without a
// record of Keel's is left as it is, and out of the record. A call that
// changes nothing runs no command.
func (d *Driver) SetVIPs(ctx context.Context, vips []netip.Addr) error {
	want := map[string]bool{}
	for _, v := range vips {
		if !v.IsValid() || !v.Is4() || v.IsUnspecified() || v.IsMulticast() || v == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return fmt.Errorf("VIP %v is not a unicast IPv4 address", v)
		}
		want[netip.PrefixFrom(v, 32).String()] = true
	}
	d.netMu.Lock()
	defer d.netMu.Unlock()
	for _, a := range slices.Clone(d.net.Aliases) {
		if a.VIP && (!want[a.Addr] || a.Iface != d.bridge) {
			if err := d.removeAliasLocked(ctx, a); err != nil {
				return fmt.Errorf("VIP %s: %w", a.Addr, err)
			}
		}
	}
	var add []string
	for _, vip := range slices.Sorted(maps.Keys(want)) {
		if i := d.aliasIndexLocked(d.bridge, vip); i < 0 || d.net.Aliases[i].Pending {
			add = append(add, vip)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := d.ensureBridgeLocked(ctx, d.bridge); err != nil {
		return err
	}
	for _, vip := range add {
		addr, _, _ := strings.Cut(vip, "/")
		if err := d.addAliasLocked(ctx, aliasRecord{Iface: d.bridge, Addr: vip, VIP: true},
			"ifconfig", d.bridge, "alias", addr, "netmask", "255.255.255.255"); err != nil {
			return fmt.Errorf("VIP %s: %w", addr, err)
		}
	}
	return nil
}

// SetRoutes implements nodeexec.Network: a kernel route to each peer's
// subnet through the peer's address, `route add -net <subnet> <via>`
// (docs/freebsd-notes.md §4.7: the gateway a bare address), and `route
// delete -net` of the routes no longer wanted. Only routes Keel recorded
// adding are ever removed; a route to a subnet that exists without such a
// record is left as it is. A call that changes nothing runs no command.
func (d *Driver) SetRoutes(ctx context.Context, routes []nodeexec.Route) error {
	want := map[string]string{}
	for _, r := range routes {
		if !r.Dest.IsValid() || !r.Dest.Addr().Is4() || r.Dest != r.Dest.Masked() || r.Dest.Bits() == 0 {
			return fmt.Errorf("route %s: not an IPv4 subnet", r.Dest)
		}
		if !r.Via.IsValid() || !r.Via.Is4() || r.Via.IsUnspecified() {
			return fmt.Errorf("route %s via %v: not an IPv4 gateway", r.Dest, r.Via)
		}
		dest := r.Dest.String()
		if via, dup := want[dest]; dup && via != r.Via.String() {
			return fmt.Errorf("route %s: two gateways, %s and %s", dest, via, r.Via)
		}
		want[dest] = r.Via.String()
	}
	d.netMu.Lock()
	defer d.netMu.Unlock()
	for _, r := range slices.Clone(d.net.Routes) {
		if via, ok := want[r.Dest]; ok && via == r.Via {
			continue // kept (or, when pending, completed below)
		}
		if _, err := d.tolerate(ctx, msgNoRoute, "route", "delete", "-net", r.Dest); err != nil {
			return fmt.Errorf("route %s: %w", r.Dest, err)
		}
		d.net.Routes = slices.DeleteFunc(d.net.Routes, func(x routeRecord) bool { return x.Dest == r.Dest })
		if err := d.saveNetLocked(); err != nil {
			return err
		}
	}
	dests := make([]string, 0, len(want))
	for dest := range want {
		dests = append(dests, dest)
	}
	slices.SortFunc(dests, func(a, b string) int {
		pa, pb := netip.MustParsePrefix(a), netip.MustParsePrefix(b)
		return cmp.Or(pa.Addr().Compare(pb.Addr()), pa.Bits()-pb.Bits())
	})
	for _, dest := range dests {
		if err := d.addRouteLocked(ctx, routeRecord{Dest: dest, Via: want[dest]}); err != nil {
			return fmt.Errorf("route %s: %w", dest, err)
		}
	}
	return nil
}

// addRouteLocked adds a route and records it, as addAliasLocked does an
// alias. d.netMu is held.
func (d *Driver) addRouteLocked(ctx context.Context, r routeRecord) error {
	index := func() int {
		return slices.IndexFunc(d.net.Routes, func(x routeRecord) bool { return x.Dest == r.Dest })
	}
	i := index()
	if i >= 0 && !d.net.Routes[i].Pending {
		return nil
	}
	wasPending := i >= 0
	if !wasPending {
		// Asked first, as addAliasLocked does.
		// No route: "route has not been found", exit 0 with route_netlink.c
		// (rtmsg_nl_int), 1 with the routing-socket route.c of older
		// releases.
		res, err := d.run(ctx, "route", "-n", "get", "-net", r.Dest)
		if err != nil {
			return err
		}
		if res.Code != 0 {
			if e := (&cmdError{argv: []string{"route", "-n", "get", "-net", r.Dest}, code: res.Code, stderr: string(res.Stderr)}); !e.has(msgNoRoute...) {
				return e
			}
		} else if routeIs(res.Stdout, netip.MustParsePrefix(r.Dest)) {
			d.log.Info("a route Keel wants exists already; it is not Keel's and will be left alone", "dest", r.Dest)
			return nil
		}
		r.Pending = true
		d.net.Routes = append(d.net.Routes, r)
		if err := d.saveNetLocked(); err != nil {
			return err
		}
	}
	already, err := d.tolerate(ctx, msgExists, "route", "add", "-net", r.Dest, r.Via)
	i = index()
	switch {
	case err != nil || already && !wasPending:
		if already {
			d.log.Info("a route Keel wants exists already; it is not Keel's and will be left alone", "dest", r.Dest)
		}
		d.net.Routes = slices.Delete(d.net.Routes, i, i+1)
	default:
		d.net.Routes[i].Pending = false
	}
	if serr := d.saveNetLocked(); err == nil {
		err = serr
	}
	return err
}

// hasInet reports whether ifconfig's block of an interface shows the IPv4
// address addr: a line "inet <addr> netmask ..." (sbin/ifconfig/af_inet.c
// in_status).
func hasInet(out []byte, addr string) bool {
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "inet" && f[1] == addr {
			return true
		}
	}
	return false
}

// routeIs reports whether `route -n get -net <p>` found a route to exactly
// p: its destination and mask lines (sbin/route/route_netlink.c
// print_getmsg; no mask line for a host route), not a covering one.
func routeIs(out []byte, p netip.Prefix) bool {
	var dst, mask string
	for line := range strings.Lines(string(out)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "destination":
			dst = strings.TrimSpace(v)
		case "mask":
			mask = strings.TrimSpace(v)
		}
	}
	if dst != p.Addr().String() {
		return false
	}
	m := net.CIDRMask(p.Bits(), 32)
	want := fmt.Sprintf("%d.%d.%d.%d", m[0], m[1], m[2], m[3])
	return mask == want || mask == "" && p.Bits() == 32
}
