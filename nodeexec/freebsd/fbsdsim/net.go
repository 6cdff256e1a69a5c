package fbsdsim

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"strconv"
	"strings"
)

// ifconfigUsage is usage() in sbin/ifconfig/ifconfig.c (FreeBSD 14).
const ifconfigUsage = "usage: ifconfig [-j jail] [-f type:format] interface address_family\n" +
	"                [address [dest_address]] [parameters]\n" +
	"       ifconfig [-j jail] interface create\n" +
	"       ifconfig [-j jail] -a [-dDkmuvWg] [-G nogroup] [address_family]\n" +
	"       ifconfig [-j jail] -l [-du] [address_family]\n" +
	"       ifconfig [-j jail] [-dkmuv]\n"

func (c *call) ifaceIn(name string) *Iface { return c.st.Iface(c.vnet, name) }

// cmdIfconfig is ifconfig(8) in the VNET c.vnet.
func cmdIfconfig(c *call, args []string) int {
	if len(args) == 0 {
		for _, i := range c.vnetIfaces() {
			c.printIface(i)
		}
		return 0
	}
	if strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "-l":
			var n []string
			for _, i := range c.vnetIfaces() {
				n = append(n, i.Name)
			}
			c.outf("%s\n", strings.Join(n, " "))
			return 0
		case "-a":
			for _, i := range c.vnetIfaces() {
				c.printIface(i)
			}
			return 0
		}
		fmt.Fprintf(c.errb, "ifconfig: illegal option -- %s\n%s", strings.TrimPrefix(args[0], "-"), ifconfigUsage)
		return 1
	}
	name, params := args[0], args[1:]
	ifc := c.ifaceIn(name)
	isCreate := len(params) > 0 && (params[0] == "create" || params[0] == "plumb")
	if ifc == nil {
		if isCreate {
			return c.cloneCreate(name, params[1:])
		}
		// ifconfig.c main: errx(1, "interface %s does not exist", ifname).
		fmt.Fprintf(c.errb, "ifconfig: interface %s does not exist\n", name)
		return 1
	}
	if isCreate {
		// ifconfig.c main: an existing interface with create alone is
		// "already exists"; with more parameters create is dropped.
		if len(params) == 1 {
			fmt.Fprintf(c.errb, "ifconfig: interface %s already exists\n", name)
			return 1
		}
		params = params[1:]
	}
	if len(params) == 0 {
		c.printIface(ifc)
		return 0
	}
	var addr, mask string
	alias, del, printName := false, false, false
	for k := 0; k < len(params); k++ {
		p := params[k]
		next := func() (string, bool) {
			if k+1 >= len(params) {
				fmt.Fprintf(c.errb, "ifconfig: '%s' requires argument\n", p)
				return "", false
			}
			k++
			return params[k], true
		}
		// ifconfig.c basic_cmds and ifclone.c clone_cmds; create and
		// plumb are clone commands only, so here they are taken for an
		// address (bad value).
		switch p {
		case "destroy", "unplumb":
			return c.destroyIface(ifc)
		case "up":
			ifc.Up = true
		case "down":
			ifc.Up = false
		case "inet":
		case "alias", "add":
			alias = true
		case "-alias", "delete", "remove":
			del = true
		case "netmask":
			v, ok := next()
			if !ok {
				return 1
			}
			mask = v
		case "name":
			v, ok := next()
			if !ok {
				return 1
			}
			if c.ifaceIn(v) != nil {
				fmt.Fprintf(c.errb, "ifconfig: ioctl SIOCSIFNAME (set name): File exists\n")
				return 1
			}
			c.renameIface(ifc, v)
			name, printName = v, true
		case "addm", "deletem":
			v, ok := next()
			if !ok {
				return 1
			}
			if code := c.bridgeMember(ifc, p, v); code != 0 {
				return code
			}
		case "vnet", "-vnet":
			v, ok := next()
			if !ok {
				return 1
			}
			if p == "-vnet" {
				fmt.Fprintf(c.errb, "fbsdsim: ifconfig -vnet is not modelled\n")
				return 1
			}
			return c.moveToVNet(ifc, v)
		default:
			if addr != "" || !looksLikeInet(p) {
				// af_inet.c in_getaddr: errx(1, "%s: bad value", s).
				fmt.Fprintf(c.errb, "ifconfig: %s: bad value\n", p)
				return 1
			}
			addr = p
		}
	}
	if addr != "" {
		if code := c.setAddr(ifc, addr, mask, alias, del); code != 0 {
			return code
		}
	}
	if printName {
		c.outf("%s\n", name)
	}
	return 0
}

func looksLikeInet(s string) bool {
	a, _, _ := strings.Cut(s, "/")
	ip, err := netip.ParseAddr(a)
	return err == nil && ip.Is4()
}

func (c *call) vnetIfaces() []*Iface {
	var out []*Iface
	for _, i := range c.st.Ifaces {
		if i.VNet == c.vnet {
			out = append(out, i)
		}
	}
	return out
}

// cloneCreate is `ifconfig bridge|bridgeN|epair|epairN create`
// (ifclone.c ifclonecreate; the kernel picks the lowest free unit and
// ifconfig prints the name it got back).
func (c *call) cloneCreate(name string, rest []string) int {
	var kind string
	var unitStr string
	switch {
	case strings.HasPrefix(name, "bridge"):
		kind, unitStr = "bridge", strings.TrimPrefix(name, "bridge")
	case strings.HasPrefix(name, "epair"):
		kind, unitStr = "epair", strings.TrimPrefix(name, "epair")
	default:
		fmt.Fprintf(c.errb, "ifconfig: SIOCIFCREATE2: Invalid argument\n")
		return 1
	}
	used := map[int]bool{}
	for _, i := range c.st.Ifaces {
		if i.Kind == kind {
			used[i.Unit] = true
		}
	}
	unit := 0
	if unitStr != "" {
		n, err := strconv.Atoi(unitStr)
		if err != nil {
			fmt.Fprintf(c.errb, "ifconfig: SIOCIFCREATE2: Invalid argument\n")
			return 1
		}
		if used[n] {
			// ifconfig.c ioctl_ifcreate: EEXIST is errx(1, "interface
			// %s already exists") with the name asked for.
			fmt.Fprintf(c.errb, "ifconfig: interface %s already exists\n", name)
			return 1
		}
		unit = n
	} else {
		for used[unit] {
			unit++
		}
	}
	if len(rest) > 0 {
		fmt.Fprintf(c.errb, "fbsdsim: ifconfig %s create %s is not modelled\n", name, strings.Join(rest, " "))
		return 1
	}
	if kind == "bridge" {
		n := fmt.Sprintf("bridge%d", unit)
		c.st.Ifaces = append(c.st.Ifaces, &Iface{Name: n, VNet: c.vnet, Kind: kind, Unit: unit})
		c.outf("%s\n", n)
		return 0
	}
	a, b := fmt.Sprintf("epair%da", unit), fmt.Sprintf("epair%db", unit)
	c.st.Ifaces = append(c.st.Ifaces,
		&Iface{Name: a, VNet: c.vnet, Kind: kind, Unit: unit, Peer: b},
		&Iface{Name: b, VNet: c.vnet, Kind: kind, Unit: unit, Peer: a})
	c.outf("%s\n", a)
	return 0
}

// destroyIface: an epair goes with both ends, wherever the other end is
// (docs/freebsd-notes.md §4.5).
func (c *call) destroyIface(ifc *Iface) int {
	if ifc.Kind != "bridge" && ifc.Kind != "epair" {
		fmt.Fprintf(c.errb, "ifconfig: SIOCIFDESTROY: Invalid argument\n")
		return 1
	}
	gone := map[*Iface]bool{ifc: true}
	if ifc.Kind == "epair" {
		if p := c.st.iface(ifc.Peer); p != nil {
			gone[p] = true
		}
	}
	keep := c.st.Ifaces[:0]
	for _, i := range c.st.Ifaces {
		if !gone[i] {
			keep = append(keep, i)
		}
	}
	c.st.Ifaces = keep
	for g := range gone {
		c.detach(g)
	}
	return 0
}

// detach drops what refers to an interface leaving its VNET: bridge
// membership and the routes through it.
func (c *call) detach(g *Iface) {
	for _, i := range c.st.Ifaces {
		if i.VNet == g.VNet {
			i.Members = removeStr(i.Members, g.Name)
		}
	}
	rk := c.st.Routes[:0]
	for _, r := range c.st.Routes {
		if !(r.VNet == g.VNet && r.Iface == g.Name) {
			rk = append(rk, r)
		}
	}
	c.st.Routes = rk
}

func removeStr(l []string, s string) []string {
	out := l[:0]
	for _, x := range l {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

func (c *call) renameIface(ifc *Iface, to string) {
	old := ifc.Name
	ifc.Name = to
	for _, i := range c.st.Ifaces {
		if i.Peer == old {
			i.Peer = to
		}
		for k, m := range i.Members {
			if m == old && i.VNet == ifc.VNet {
				i.Members[k] = to
			}
		}
	}
	for k, r := range c.st.Routes {
		if r.VNet == ifc.VNet && r.Iface == old {
			c.st.Routes[k].Iface = to
		}
	}
}

// bridgeMember is addm/deletem (sbin/ifconfig/ifbridge.c setbridge_add:
// err(1, "BRDGADD %s", val); the kernel's bridge_ioctl_add returns
// ENOENT for no such interface, EEXIST for a member already, EBUSY for a
// member of another bridge).
func (c *call) bridgeMember(br *Iface, op, m string) int {
	cmd := "BRDGADD"
	if op == "deletem" {
		cmd = "BRDGDEL"
	}
	if br.Kind != "bridge" {
		fmt.Fprintf(c.errb, "ifconfig: %s %s: Invalid argument\n", cmd, m)
		return 1
	}
	mi := c.ifaceIn(m)
	if mi == nil {
		fmt.Fprintf(c.errb, "ifconfig: %s %s: No such file or directory\n", cmd, m)
		return 1
	}
	if op == "deletem" {
		if !contains(br.Members, m) {
			// if_bridge.c bridge_ioctl_del: ENOENT for no member.
			fmt.Fprintf(c.errb, "ifconfig: BRDGDEL %s: No such file or directory\n", m)
			return 1
		}
		br.Members = removeStr(br.Members, m)
		return 0
	}
	if contains(br.Members, m) {
		fmt.Fprintf(c.errb, "ifconfig: BRDGADD %s: File exists\n", m)
		return 1
	}
	for _, o := range c.vnetIfaces() {
		if o != br && contains(o.Members, m) {
			fmt.Fprintf(c.errb, "ifconfig: BRDGADD %s: Device busy\n", m)
			return 1
		}
	}
	br.Members = append(br.Members, m)
	return 0
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// moveToVNet is `ifconfig <if> vnet <jail>` (ifconfig.c setifvnet:
// jail_getid, then err(1, "SIOCSIFVNET"); sys/net/if.c if_vmove_loan
// returns EEXIST when the jail has no VNET of its own, "Do not try to
// move the iface from and to the same prison", and when the name exists
// there). The interface arrives down and without addresses.
func (c *call) moveToVNet(ifc *Iface, jname string) int {
	j := lookupJail(c.st, jname)
	if j == nil {
		fmt.Fprintf(c.errb, "ifconfig: jail \"%s\" not found\n", jname)
		return 1
	}
	dst := ""
	if j.VNet {
		dst = j.Name
	}
	if dst == ifc.VNet || c.st.Iface(dst, ifc.Name) != nil {
		fmt.Fprintf(c.errb, "ifconfig: SIOCSIFVNET: File exists\n")
		return 1
	}
	c.detach(ifc)
	ifc.VNet, ifc.Addrs, ifc.Up = dst, nil, false
	return 0
}

// setAddr adds (alias), replaces (no alias: ifconfig.c setifaddr sets
// clearaddr, so the first address is deleted before SIOCAIFADDR, and
// setting it again succeeds) or deletes (-alias) an IPv4 address. An
// address without a prefix or netmask fails on FreeBSD 15 (see MODEL.md;
// FreeBSD 13 and 14 warned and took the classful mask, docs/freebsd-
// notes.md §10.14). Errors go through Perror in ifconfig.c: "ioctl
// (SIOCAIFADDR): File exists", "ioctl (SIOCDIFADDR): Can't assign
// requested address".
func (c *call) setAddr(ifc *Iface, addr, mask string, alias, del bool) int {
	ipS, plen, hasLen := strings.Cut(addr, "/")
	ip, _ := netip.ParseAddr(ipS)
	prefix := -1
	if hasLen {
		// af_inet.c in_getaddr: strtonum(0, 32), errx "%s: bad value
		// (width %s)".
		n, err := strconv.Atoi(plen)
		why := ""
		switch {
		case plen == "" || plen[0] < '0' || plen[0] > '9' || err != nil:
			why = "invalid"
		case n > 32:
			why = "too large"
		}
		if why != "" {
			fmt.Fprintf(c.errb, "ifconfig: %s: bad value (width %s)\n", addr, why)
			return 1
		}
		prefix = n
	}
	if mask != "" {
		m, err := netip.ParseAddr(mask)
		if err != nil || !m.Is4() {
			fmt.Fprintf(c.errb, "ifconfig: %s: bad value\n", mask)
			return 1
		}
		prefix = maskLen(m)
	}
	if del {
		for k, a := range ifc.Addrs {
			if a.IP == ip.String() {
				ifc.Addrs = append(ifc.Addrs[:k], ifc.Addrs[k+1:]...)
				c.dropRoutesVia(ifc)
				return 0
			}
		}
		fmt.Fprintf(c.errb, "ifconfig: ioctl (SIOCDIFADDR): Can't assign requested address\n")
		return 1
	}
	if prefix < 0 && ifc.Kind != "loopback" {
		fmt.Fprintf(c.errb, "ifconfig: setting interface address without mask is no longer supported\n")
		return 1
	}
	if prefix < 0 {
		prefix = 8
	}
	if !alias && len(ifc.Addrs) > 0 {
		// clearaddr: SIOCDIFADDR of the first address.
		ifc.Addrs = ifc.Addrs[1:]
		c.dropRoutesVia(ifc)
	}
	for _, a := range ifc.Addrs {
		if a.IP == ip.String() {
			fmt.Fprintf(c.errb, "ifconfig: ioctl (SIOCAIFADDR): File exists\n")
			return 1
		}
	}
	na := Addr{IP: ip.String(), Prefix: prefix}
	if !alias {
		ifc.Addrs = append([]Addr{na}, ifc.Addrs...)
	} else {
		ifc.Addrs = append(ifc.Addrs, na)
	}
	ifc.Up = true
	return 0
}

// dropRoutesVia removes routes whose gateway is no longer on a connected
// network of the interface (the kernel drops routes of a removed ifa).
func (c *call) dropRoutesVia(ifc *Iface) {
	rk := c.st.Routes[:0]
	for _, r := range c.st.Routes {
		if r.VNet == ifc.VNet && r.Iface == ifc.Name && c.connectedIface(r.Gateway) != ifc {
			continue
		}
		rk = append(rk, r)
	}
	c.st.Routes = rk
}

func maskLen(m netip.Addr) int {
	b := m.As4()
	n := 0
	for _, x := range b {
		for i := 7; i >= 0; i-- {
			if x&(1<<i) != 0 {
				n++
			}
		}
	}
	return n
}

// printIface prints the block of ifconfig.c status() with af_inet.c
// in_status's "\tinet %s netmask 0x%x broadcast %s" lines.
func (c *call) printIface(i *Iface) {
	flags, mtu := "8802<BROADCAST,SIMPLEX,MULTICAST>", 1500
	switch {
	case i.Kind == "loopback" && i.Up:
		flags, mtu = "8049<UP,LOOPBACK,RUNNING,MULTICAST>", 16384
	case i.Kind == "loopback":
		flags, mtu = "8008<LOOPBACK,MULTICAST>", 16384
	case i.Up:
		flags = "8843<UP,BROADCAST,RUNNING,SIMPLEX,MULTICAST>"
	}
	c.outf("%s: flags=%s metric 0 mtu %d\n", i.Name, flags, mtu)
	if i.Kind != "loopback" {
		h := fnv.New32a()
		h.Write([]byte(i.Name))
		s := h.Sum32()
		c.outf("\tether 58:9c:fc:%02x:%02x:%02x\n", byte(s>>16), byte(s>>8), byte(s))
	}
	for _, a := range i.Addrs {
		p := a.prefix()
		m := uint32(0xffffffff) << (32 - a.Prefix)
		if a.Prefix == 0 {
			m = 0
		}
		// af_inet.c in_status: " netmask 0x%lx".
		if i.Kind == "loopback" {
			c.outf("\tinet %s netmask 0x%x\n", a.IP, m)
			continue
		}
		b := p.Masked().Addr().As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		v |= ^m
		c.outf("\tinet %s netmask 0x%x broadcast %d.%d.%d.%d\n", a.IP, m, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	for _, m := range i.Members {
		c.outf("\tmember: %s flags=143<LEARNING,DISCOVER,AUTOEDGE,AUTOPTP>\n", m)
	}
	switch i.Kind {
	case "bridge":
		c.outf("\tgroups: bridge\n")
	case "epair":
		c.outf("\tgroups: epair\n")
	case "loopback":
		c.outf("\tgroups: lo\n")
	}
}

// routeUsage is usage() in sbin/route/route.c: errx(EX_USAGE, ...), so
// it carries the program name.
const routeUsage = "route: usage: route [-46dnqtv] command [[modifiers] args]\n"

// cmdRoute is route(8) in the VNET c.vnet (sbin/route/route.c: main
// getopt "46nqdtv"; newroute prints "<cmd> net <dest>: gateway <gw>" and,
// on failure, "... fib <n>: route already in table" / "not in table" on
// stdout; the netlink path of FreeBSD 14+ warns "message indicates
// error: File exists" and "route has not been found" on stderr,
// docs/freebsd-notes.md §4.7, §10.13, §10.19).
func cmdRoute(c *call, args []string) int {
	r := getopt("route", args, "46nqdtv")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+routeUsage)
		return 64
	}
	if len(r.rest) == 0 {
		fmt.Fprint(c.errb, routeUsage)
		return 64
	}
	cmd, rest := r.rest[0], r.rest[1:]
	switch cmd {
	case "add", "delete", "get", "change":
	default:
		fmt.Fprintf(c.errb, "route: bad keyword: %s\n%s", cmd, routeUsage)
		return 64
	}
	forceNet, forceHost := false, false
	var dest, gw string
	for k := 0; k < len(rest); k++ {
		a := rest[k]
		switch {
		case a == "-net":
			forceNet = true
		case a == "-host":
			forceHost = true
		case a == "-inet":
		case strings.HasPrefix(a, "-"):
			fmt.Fprintf(c.errb, "route: bad keyword: %s\n%s", a[1:], routeUsage)
			return 64
		case dest == "":
			dest = a
		case gw == "":
			gw = a
		default:
			fmt.Fprintf(c.errb, "fbsdsim: route netmask argument is not modelled\n")
			return 64
		}
	}
	if dest == "" {
		fmt.Fprintf(c.errb, "route: destination parameter required\n%s", routeUsage)
		return 64
	}
	pfx, isHost, ok := parseDest(dest, forceNet, forceHost)
	if !ok {
		fmt.Fprintf(c.errb, "route: bad address: %s\n", dest)
		return 68
	}
	kind := "net"
	if isHost {
		kind = "host"
	}
	key := pfx.String()
	if pfx.Bits() == 0 {
		key = "default"
	}
	idx := -1
	for k, rt := range c.st.Routes {
		if rt.VNet == c.vnet && rt.Dest == key {
			idx = k
		}
	}
	switch cmd {
	case "get":
		return c.routeGet(dest, pfx)
	case "add", "change":
		if gw == "" {
			fmt.Fprintf(c.errb, "fbsdsim: route %s without a gateway is not modelled\n", cmd)
			return 64
		}
		g, err := netip.ParseAddr(gw)
		if err != nil || !g.Is4() {
			fmt.Fprintf(c.errb, "route: bad address: %s\n", gw)
			return 68
		}
		ifc := c.connectedIface(gw)
		fail := func(warn, msg string) int {
			fmt.Fprintf(c.errb, "route: message indicates error: %s\n", warn)
			c.outf("%s %s %s: gateway %s fib 0: %s\n", cmd, kind, dest, gw, msg)
			return 1
		}
		if cmd == "add" && idx >= 0 {
			return fail("File exists", "route already in table")
		}
		if cmd == "change" && idx < 0 {
			fmt.Fprintf(c.errb, "route: route has not been found\n")
			c.outf("%s %s %s: gateway %s fib 0: not in table\n", cmd, kind, dest, gw)
			return 1
		}
		if ifc == nil {
			return fail("Network is unreachable", "Network is unreachable")
		}
		nr := Route{VNet: c.vnet, Dest: key, Gateway: g.String(), Iface: ifc.Name}
		if idx >= 0 {
			c.st.Routes[idx] = nr
		} else {
			c.st.Routes = append(c.st.Routes, nr)
		}
		c.outf("%s %s %s: gateway %s\n", cmd, kind, dest, gw)
		return 0
	}
	// delete
	if idx < 0 {
		fmt.Fprintf(c.errb, "route: route has not been found\n")
		if gw != "" {
			c.outf("delete %s %s: gateway %s fib 0: not in table\n", kind, dest, gw)
		} else {
			c.outf("delete %s %s fib 0: not in table\n", kind, dest)
		}
		return 1
	}
	c.st.Routes = append(c.st.Routes[:idx], c.st.Routes[idx+1:]...)
	if gw != "" {
		c.outf("delete %s %s: gateway %s\n", kind, dest, gw)
	} else {
		c.outf("delete %s %s\n", kind, dest)
	}
	return 0
}

// parseDest follows route.c getaddr for AF_INET: "default", a.b.c.d/n
// (a network), a bare address (a host unless -net, then classful).
func parseDest(d string, forceNet, forceHost bool) (netip.Prefix, bool, bool) {
	if d == "default" {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0), false, true
	}
	a, l, has := strings.Cut(d, "/")
	ip, err := netip.ParseAddr(a)
	if err != nil || !ip.Is4() {
		return netip.Prefix{}, false, false
	}
	if has {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 || n > 32 {
			return netip.Prefix{}, false, false
		}
		return netip.PrefixFrom(ip, n).Masked(), false, true
	}
	if forceNet && !forceHost {
		b := ip.As4()[0]
		n := 24
		if b < 128 {
			n = 8
		} else if b < 192 {
			n = 16
		}
		return netip.PrefixFrom(ip, n).Masked(), false, true
	}
	return netip.PrefixFrom(ip, 32), true, true
}

// connectedIface returns the up interface of the VNET whose connected
// route to ip is the most specific (the routing table's longest match), or
// nil (gateway unreachable). A loopback interface's address is a host
// route only: sys/netinet/in.c in_ifinit adds RTF_HOST for IFF_LOOPBACK,
// so lo0's 127.0.0.1/8 reaches 127.0.0.1 and nothing else of 127/8.
func (c *call) connectedIface(ip string) *Iface {
	g, err := netip.ParseAddr(ip)
	if err != nil {
		return nil
	}
	var best *Iface
	bestLen := -1
	for _, i := range c.vnetIfaces() {
		if !i.Up {
			continue
		}
		for _, a := range i.Addrs {
			p := a.prefix().Masked()
			if i.Kind == "loopback" {
				p = netip.PrefixFrom(a.prefix().Addr(), 32)
			}
			if p.Contains(g) && p.Bits() > bestLen {
				best, bestLen = i, p.Bits()
			}
		}
	}
	return best
}

// routeGet is `route -n get <dest>` (route.c print_getmsg).
func (c *call) routeGet(dest string, pfx netip.Prefix) int {
	var best *Route
	bestLen := -1
	for k, rt := range c.st.Routes {
		if rt.VNet != c.vnet {
			continue
		}
		var p netip.Prefix
		if rt.Dest == "default" {
			p = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		} else {
			p = netip.MustParsePrefix(rt.Dest)
		}
		if p.Contains(pfx.Addr()) && p.Bits() <= pfx.Bits() && p.Bits() > bestLen {
			best, bestLen = &c.st.Routes[k], p.Bits()
		}
	}
	connected := c.connectedIface(pfx.Addr().String())
	if connected != nil && pfx.Bits() > 0 {
		for _, a := range connected.Addrs {
			if a.prefix().Masked().Contains(pfx.Addr()) && a.Prefix > bestLen {
				c.outf("   route to: %s\ndestination: %s\n       mask: %s\n        fib: 0\n  interface: %s\n      flags: <UP,DONE,PINNED>\n",
					pfx.Addr(), a.prefix().Masked().Addr(), maskStr(a.Prefix), connected.Name)
				c.outf(" recvpipe  sendpipe  ssthresh  rtt,msec    mtu        weight    expire\n       0         0         0         0      1500         1         0 \n")
				return 0
			}
		}
	}
	if best == nil {
		// route_netlink.c rtmsg_nl_int: a get answered by ESRCH is
		// warn("route has not been found") and returns 0, so route exits
		// 0. warn appends ": " and strerror(errno), which errno holds
		// then is not modelled (nothing is appended).
		fmt.Fprintf(c.errb, "route: route has not been found\n")
		return 0
	}
	to, dst, mask := pfx.Addr().String(), best.Dest, "default"
	if dest == "default" {
		to = "default"
	}
	if best.Dest != "default" {
		p := netip.MustParsePrefix(best.Dest)
		dst, mask = p.Addr().String(), maskStr(p.Bits())
	}
	c.outf("   route to: %s\ndestination: %s\n       mask: %s\n    gateway: %s\n        fib: 0\n  interface: %s\n      flags: <UP,GATEWAY,DONE,STATIC>\n",
		to, dst, mask, best.Gateway, best.Iface)
	c.outf(" recvpipe  sendpipe  ssthresh  rtt,msec    mtu        weight    expire\n       0         0         0         0      1500         1         0 \n")
	return 0
}

func maskStr(bits int) string {
	m := uint32(0xffffffff) << (32 - bits)
	if bits == 0 {
		m = 0
	}
	return fmt.Sprintf("%d.%d.%d.%d", byte(m>>24), byte(m>>16), byte(m>>8), byte(m))
}
