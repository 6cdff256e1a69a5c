package render

import (
	"hash/fnv"
	"net/netip"
	"slices"
)

// hashName is FNV-1a (64 bits) of a name: the starting point of every
// derived allocation, so that it depends on the name alone.
func hashName(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// probe returns the first free slot at or after hashName(name) mod n,
// wrapping around, or -1 when all n slots are taken.
func probe(name string, n int, taken func(int) bool) int {
	start := int(hashName(name) % uint64(n))
	for i := range n {
		if slot := (start + i) % n; !taken(slot) {
			return slot
		}
	}
	return -1
}

// addrOffset is a's distance from the start of p.
func addrOffset(p netip.Prefix, a netip.Addr) int {
	b, x := p.Addr().As4(), a.As4()
	return int(be32(x) - be32(b))
}

func be32(b [4]byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrAt(p netip.Prefix, offset int) netip.Addr {
	v := be32(p.Addr().As4()) + uint32(offset)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// allocateSubnets gives every node its /24 of the pod CIDR: explicit ones
// first, then keel.lock's, then derived ones in sorted name order, so that a
// new node never moves an existing allocation.
func (r *renderer) allocateSubnets(m *Model) {
	pod := m.Cluster.PodCIDR.Prefix
	if pod.Bits() > 24 {
		return
	}
	n := 1 << (24 - pod.Bits())
	taken := map[int]string{}
	for _, node := range m.Nodes {
		if node.PodCIDRSource == SourceExplicit && pod.Contains(node.PodCIDR.Addr()) && node.PodCIDR.Bits() == 24 {
			taken[addrOffset(pod, node.PodCIDR.Addr())>>8] = node.Name
		}
	}
	for i := range m.Nodes {
		node := &m.Nodes[i]
		locked, ok := r.lock.Subnets[node.Name]
		if !ok || node.PodCIDRSource == SourceExplicit {
			continue
		}
		field := "subnets." + node.Name
		switch slot := addrOffset(pod, locked.Addr()) >> 8; {
		case locked.Bits() != 24:
			r.diag.errorf(r.lockDec.at(field), field, "%s: a node's subnet is a /24", locked)
		case !pod.Contains(locked.Addr()):
			r.diag.errorf(r.lockDec.at(field), field, "%s is outside the cluster's podCIDR %s; remove the entry and run keel lock", locked, pod)
		case taken[slot] != "":
			r.diag.errorf(r.lockDec.at(field), field, "%s is also the subnet of node %s; remove one entry and run keel lock", locked, taken[slot])
		default:
			taken[slot] = node.Name
			node.PodCIDR, node.PodCIDRSource = locked, SourceLocked
		}
	}
	for i := range m.Nodes {
		node := &m.Nodes[i]
		if node.PodCIDRSource != "" || node.Name == "" {
			continue
		}
		slot := probe(node.Name, n, func(s int) bool { return taken[s] != "" })
		if slot < 0 {
			r.diag.errorf(node.Source, "metadata.name", "no free /24 left in podCIDR %s for node %s", pod, node.Name)
			continue
		}
		taken[slot] = node.Name
		node.PodCIDR = Prefix{netip.PrefixFrom(addrAt(pod, slot<<8), 24)}
		node.PodCIDRSource = SourceDerived
	}
}

// allocateVIPs gives every Service an address of the service CIDR (never its
// network or broadcast address): keel.lock's first, then derived ones in
// sorted name order.
func (r *renderer) allocateVIPs(m *Model) {
	svcCIDR := m.Cluster.ServiceCIDR.Prefix
	if svcCIDR.Bits() > 30 {
		return
	}
	hosts := 1<<(32-svcCIDR.Bits()) - 2 // offsets 1..hosts
	taken := map[int]string{}
	for i := range m.Services {
		svc := &m.Services[i]
		locked, ok := r.lock.VIPs[svc.Name]
		if !ok {
			continue
		}
		field := "vips." + svc.Name
		switch off := addrOffset(svcCIDR, locked.Addr); {
		case !svcCIDR.Contains(locked.Addr):
			r.diag.errorf(r.lockDec.at(field), field, "%s is outside the cluster's serviceCIDR %s; remove the entry and run keel lock", locked, svcCIDR)
		case off == 0 || off == hosts+1:
			r.diag.errorf(r.lockDec.at(field), field, "%s is the network or broadcast address of %s; remove the entry and run keel lock", locked, svcCIDR)
		case taken[off] != "":
			r.diag.errorf(r.lockDec.at(field), field, "%s is also the VIP of service %s; remove one entry and run keel lock", locked, taken[off])
		default:
			taken[off] = svc.Name
			svc.VIP, svc.VIPSource = locked, SourceLocked
		}
	}
	for i := range m.Services {
		svc := &m.Services[i]
		if svc.VIPSource != "" || svc.Name == "" {
			continue
		}
		slot := probe(svc.Name, hosts, func(s int) bool { return taken[s+1] != "" })
		if slot < 0 {
			r.diag.errorf(svc.Source, "metadata.name", "no free address left in serviceCIDR %s for service %s", svcCIDR, svc.Name)
			continue
		}
		taken[slot+1] = svc.Name
		svc.VIP, svc.VIPSource = Addr{addrAt(svcCIDR, slot+1)}, SourceDerived
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
