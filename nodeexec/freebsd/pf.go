package freebsd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
)

// PFAnchor is the pf anchor the driver loads its redirect rules into. The
// host's /etc/pf.conf must name it, or the rules are loaded but never used
// (docs/freebsd-notes.md §6):
//
//	rdr-anchor "keel"
//	anchor "keel"
//
// and, with a default-block policy, let the bridge's traffic pass, e.g.
// "pass on keel0".
const PFAnchor = "keel"

// PFRulesFile is where the driver writes the anchor's rules before loading
// them (a FreeBSD path; its directory is created).
const PFRulesFile = "/usr/local/etc/keel/pf-keel.conf"

// Redirect sends TCP connections to a port of the public interface's own
// addresses to a listener of the agent's (its ingress).
type Redirect = nodeexec.Redirect

// SetRedirects makes the anchor PFAnchor hold exactly one rule per
// redirect, in port order:
//
//	rdr pass on <iface> inet proto tcp from any to <iface> port <port> -> <addr> port <port>
//
// ("to <iface>": the interface's own addresses; "rdr pass": the
// translated connections skip the filter rules; docs/freebsd-notes.md §6),
// written to PFRulesFile and loaded with `pfctl -a keel -f <file>`, which
// replaces the anchor's rules. No redirects empties the anchor. Rules equal
// to those this driver loaded last are not loaded again. It needs
// Options.PublicIface.
func (d *Driver) SetRedirects(ctx context.Context, redirects []Redirect) error {
	if d.pubIface == "" {
		return errors.New("pf redirects: no public interface (--public-iface) is set")
	}
	rs := slices.Clone(redirects)
	slices.SortFunc(rs, func(a, b Redirect) int { return int(a.Port) - int(b.Port) })
	var b strings.Builder
	for i, r := range rs {
		if r.Port == 0 || !r.To.IsValid() || !r.To.Addr().Is4() || r.To.Port() == 0 || r.To.Addr().IsUnspecified() {
			return fmt.Errorf("pf redirect of port %d to %v: want a port and an IPv4 address with a port", r.Port, r.To)
		}
		if i > 0 && rs[i-1].Port == r.Port {
			return fmt.Errorf("pf redirect: port %d is redirected twice", r.Port)
		}
		fmt.Fprintf(&b, "rdr pass on %s inet proto tcp from any to %s port %d -> %s port %d\n",
			d.pubIface, d.pubIface, r.Port, r.To.Addr(), r.To.Port())
	}
	rules := b.String()
	d.pfMu.Lock()
	defer d.pfMu.Unlock()
	if d.pfLoaded != nil && *d.pfLoaded == rules {
		return nil
	}
	file := d.hostPath(PFRulesFile)
	if err := os.MkdirAll(d.hostPath(path.Dir(PFRulesFile)), 0o755); err != nil {
		return fmt.Errorf("pf redirects: %w", err)
	}
	if err := nodeexec.WriteFileAtomic(file, []byte(rules), 0o644); err != nil {
		return fmt.Errorf("pf redirects: %w", err)
	}
	if _, err := d.must(ctx, "pfctl", "-a", PFAnchor, "-f", PFRulesFile); err != nil {
		return fmt.Errorf("pf redirects: %w", err)
	}
	d.pfLoaded = &rules
	return nil
}
