package freebsd

import (
	"context"
	"fmt"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
)

// Problem is a host prerequisite that does not hold, with how to fix it.
// Check is one of "datasets", "forwarding", "racct", "vnet", "pf" (the
// names of report.Checks).
type Problem = nodeexec.HostProblem

var (
	_ nodeexec.HostChecker = (*Driver)(nil)
	_ nodeexec.Redirector  = (*Driver)(nil)
)

// Check implements nodeexec.HostChecker: what on this host would stop the
// driver from working, each with its fix (docs/freebsd-notes.md §0, §4.8,
// §4.9, §5, §6, §11): the parent datasets <pool>/keel/jails and
// <pool>/keel/volumes, mounted where the driver expects them; IP
// forwarding; RACCT; VNET in the kernel; and, with a public interface, pf
// enabled with the anchor in its main ruleset.
// It changes nothing. An error is returned only when a check could not
// run at all.
func (d *Driver) Check(ctx context.Context) ([]Problem, error) {
	var problems []Problem
	add := func(check, problem, fix string) {
		problems = append(problems, Problem{Check: check, Problem: problem, Fix: fix})
	}
	for _, ds := range []string{d.pool + "/keel/jails", d.pool + "/keel/volumes"} {
		ok, err := d.datasetExists(ctx, ds)
		if err != nil {
			return nil, err
		}
		if !ok {
			add("datasets", fmt.Sprintf("the dataset %s does not exist", ds), "zfs create -p "+ds)
			continue
		}
		out, err := d.must(ctx, "zfs", "get", "-H", "-o", "value", "mountpoint", ds)
		if err != nil {
			return nil, err
		}
		if mp := strings.TrimSpace(string(out)); mp != "/"+ds {
			add("datasets", fmt.Sprintf("%s is mounted at %s, not /%s", ds, mp, ds), "zfs inherit mountpoint "+ds+" (with the pool mounted at /"+d.pool+")")
		}
	}
	sysctls := []struct{ oid, check, problem, fix string }{
		{"net.inet.ip.forwarding", "forwarding", "IP forwarding is off: traffic between nodes' jails is dropped",
			`sysrc gateway_enable=YES && sysctl net.inet.ip.forwarding=1`},
		{"kern.racct.enable", "racct", "resource accounting is off: instances with limits are refused",
			`echo kern.racct.enable=1 >> /boot/loader.conf, then reboot`},
		{"kern.features.vimage", "vnet", "the kernel has no VNET: vnet jails cannot be created",
			"boot a kernel with options VIMAGE (GENERIC has it since FreeBSD 12)"},
	}
	for _, s := range sysctls {
		res, err := d.run(ctx, "sysctl", "-n", s.oid)
		if err != nil {
			return nil, err
		}
		if res.Code == 0 {
			if n, err := parseSysctlInt(res.Stdout); err == nil && n == 1 {
				continue
			}
		}
		add(s.check, s.problem, s.fix)
	}
	if d.pubIface != "" {
		p, err := d.checkPF(ctx)
		if err != nil {
			return nil, err
		}
		problems = append(problems, p...)
	}
	return problems, nil
}

// checkPF checks that pf runs (`pfctl -s info` prints "Status: Enabled",
// sbin/pfctl/pfctl_parser.c print_status) and that the main ruleset
// evaluates the anchor (`pfctl -s nat` lists rdr-anchor "keel"): rules
// loaded into an anchor nothing refers to are inert (docs/freebsd-notes.md
// §6).
func (d *Driver) checkPF(ctx context.Context) ([]Problem, error) {
	fix := `pf_enable="YES" in /etc/rc.conf, and in /etc/pf.conf: rdr-anchor "` + PFAnchor + `" and anchor "` + PFAnchor + `" (see docs), then service pf start`
	res, err := d.run(ctx, "pfctl", "-s", "info")
	if err != nil {
		return nil, err
	}
	if res.Code != 0 || !strings.Contains(string(res.Stdout), "Status: Enabled") {
		return []Problem{{Check: "pf", Problem: "pf is not enabled: the ingress redirect cannot work", Fix: fix}}, nil
	}
	res, err = d.run(ctx, "pfctl", "-s", "nat")
	if err != nil {
		return nil, err
	}
	if res.Code != 0 || !strings.Contains(string(res.Stdout), `rdr-anchor "`+PFAnchor+`"`) {
		return []Problem{{Check: "pf", Problem: `/etc/pf.conf does not name the anchor "` + PFAnchor + `": its redirects would be ignored`, Fix: fix}}, nil
	}
	return nil, nil
}
