package freebsd

import (
	"context"
	"fmt"
	"slices"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// ErrRacctDisabled is returned (wrapped) by Start and Apply for an
// instance with limits on a host whose kernel accounts for no resources
// (kern.racct.enable is 0, or RACCT is not in the kernel): the instance is
// refused rather than run unlimited. It wraps the driver-neutral
// nodeexec.ErrLimitsUnenforced.
var ErrRacctDisabled = fmt.Errorf("%w: resource accounting is off on this host (kern.racct.enable is not 1): add kern.racct.enable=1 to /boot/loader.conf and reboot", nodeexec.ErrLimitsUnenforced)

// maxPCPU is rctl's pcpu for 1024 cores, the most a spec may ask
// (docs/freebsd-notes.md §5).
const maxPCPU = 1024 * 100

// limitRules returns the rctl rules of an instance's resources
// (docs/freebsd-notes.md §5): pcpu, the percent of one core (cores × 100,
// rounded to the nearest), and vmemoryuse in bytes (virtual memory, as
// Keel always used, not memoryuse), both with the deny action. A CPU amount
// that rounds to 0 % is refused: pcpu:deny=0 would freeze the jail.
func limitRules(instance string, r render.Resources) ([]rctlRule, error) {
	var rules []rctlRule
	jail := jailName(instance)
	if r.CPU < 0 || r.Memory < 0 {
		return nil, fmt.Errorf("negative resources %+v", r)
	}
	if r.CPU > 0 {
		pcpu := (int64(r.CPU) + 5) / 10 // millicores to percent, rounded
		if pcpu == 0 {
			return nil, fmt.Errorf("cpu %s is less than 1%% of a core, which rctl cannot limit (pcpu:deny=0 would freeze the jail)", r.CPU)
		}
		if pcpu > maxPCPU || r.CPU > maxPCPU*10 {
			return nil, fmt.Errorf("cpu %s is more than 1024 cores", r.CPU)
		}
		rules = append(rules, rctlRule{Subject: "jail", ID: jail, Resource: "pcpu", Action: "deny", Amount: pcpu})
	}
	if r.Memory > 0 {
		rules = append(rules, rctlRule{Subject: "jail", ID: jail, Resource: "vmemoryuse", Action: "deny", Amount: int64(r.Memory)})
	}
	return rules, nil
}

// checkRacct returns ErrRacctDisabled unless `sysctl -n kern.racct.enable`
// prints 1. The answer is kept: the tunable changes only with a reboot.
// An unknown oid (a kernel without RACCT) counts as disabled.
func (d *Driver) checkRacct(ctx context.Context) error {
	on, err := d.racct(ctx)
	if err != nil {
		return err
	}
	if !on {
		return ErrRacctDisabled
	}
	return nil
}

func (d *Driver) racct(ctx context.Context) (bool, error) {
	d.mu.Lock()
	cached := d.facts.racct
	d.mu.Unlock()
	if cached != nil {
		return *cached, nil
	}
	res, err := d.run(ctx, "sysctl", "-n", "kern.racct.enable")
	if err != nil {
		return false, err
	}
	on := false
	if res.Code == 0 {
		n, err := parseSysctlInt(res.Stdout)
		if err != nil {
			return false, err
		}
		on = n == 1
	}
	d.mu.Lock()
	d.facts.racct = &on
	d.mu.Unlock()
	return on, nil
}

// applyRules makes the jail's rctl rules exactly want: it reads them
// (`rctl jail:<jail>`), adds each missing or different rule (`rctl -a`: the
// kernel replaces a rule of the same subject, resource and action), and
// removes those of resources no longer limited (`rctl -r
// jail:<jail>:<resource>`). With nothing wanted and nothing there, it runs
// only the read, and not even that when racct is off.
func (d *Driver) applyRules(ctx context.Context, instance string, want []rctlRule) error {
	jail := jailName(instance)
	if len(want) == 0 {
		if on, err := d.racct(ctx); err != nil || !on {
			return err
		}
	}
	out, err := d.must(ctx, "rctl", "jail:"+jail)
	if err != nil {
		return err
	}
	have, err := parseRctl(out)
	if err != nil {
		return err
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			if _, err := d.must(ctx, "rctl", "-a", w.String()); err != nil {
				return err
			}
		}
	}
	for _, h := range have {
		if h.Subject != "jail" || h.ID != jail {
			continue
		}
		if !slices.ContainsFunc(want, func(w rctlRule) bool { return w.Resource == h.Resource }) {
			if _, err := d.tolerate(ctx, msgNoRules, "rctl", "-r", "jail:"+jail+":"+h.Resource); err != nil {
				return err
			}
		}
	}
	return nil
}

// Capacity implements nodeexec.Driver: hw.ncpu cores and hw.physmem bytes
// (`sysctl -n`, docs/freebsd-notes.md §7), read once.
func (d *Driver) Capacity(ctx context.Context) (render.Resources, error) {
	d.mu.Lock()
	cached := d.facts.capacity
	d.mu.Unlock()
	if cached != nil {
		return *cached, nil
	}
	var vals [2]int64
	for i, oid := range []string{"hw.ncpu", "hw.physmem"} {
		out, err := d.must(ctx, "sysctl", "-n", oid)
		if err != nil {
			return render.Resources{}, fmt.Errorf("capacity: %w", err)
		}
		if vals[i], err = parseSysctlInt(out); err != nil || vals[i] <= 0 {
			return render.Resources{}, fmt.Errorf("capacity: %s: %q is not a positive number", oid, out)
		}
	}
	c := render.Resources{CPU: render.CPU(vals[0] * 1000), Memory: render.Bytes(vals[1])}
	d.mu.Lock()
	d.facts.capacity = &c
	d.mu.Unlock()
	return c, nil
}
