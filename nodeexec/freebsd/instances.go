package freebsd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/logfile"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
)

// child is a workload this Driver started with jexec: the jail's first
// process. Its reaper goroutine waits for it, sets code and at, then
// closes done.
type child struct {
	proc nodeexec.Process
	p    Proc
	done chan struct{}
	code int
	at   time.Time
	// attached is set (under Driver.mu) once ps showed the process in its
	// jail: from then on ps alone says whether it lives. Before, jexec
	// may not have entered the jail yet.
	attached bool
	// detached is set (under Driver.mu) when the jail was seen running
	// after the leader had exited: the command started daemons and
	// returned, as /etc/rc does. The instance's end is then not the
	// leader's, and its exit is unknown.
	detached bool
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// reap waits for the workload: every process Start starts is waited for,
// or its zombie would pin the jail's root (docs/freebsd-notes.md §1.7).
func (d *Driver) reap(c *child) {
	code, err := c.p.Wait()
	if err != nil {
		code = -1
	}
	c.code, c.at = code, d.now()
	close(c.done)
}

// Running implements nodeexec.Instances: the instances whose jail
// (keel-<name>, from jls) holds a process that is not a zombie
// (docs/freebsd-notes.md §1.5). The workload runs as long as its jail has
// a live process, also after the first one returned (a command that starts
// daemons, as /etc/rc does). An instance's identity is its first process's
// PID and start time, recorded at Start, so an agent restarted at any
// moment reports the same Process.
//
// Running also caps the logs of every running instance at Options.LogMax.
func (d *Driver) Running(ctx context.Context) (map[string]nodeexec.Process, error) {
	all, err := d.running(ctx)
	if err != nil {
		return nil, err
	}
	for name := range all {
		d.capLogs(name)
	}
	return all, nil
}

// running is Running without the log maintenance.
func (d *Driver) running(ctx context.Context) (map[string]nodeexec.Process, error) {
	// The children started before the scan: only those can be judged
	// gone by it.
	d.mu.Lock()
	before := maps.Clone(d.children)
	d.mu.Unlock()
	jails, err := d.jails(ctx)
	if err != nil {
		return nil, fmt.Errorf("running: %w", err)
	}
	out := map[string]nodeexec.Process{}
	kids := map[string]bool{} // found as this driver's children
	for _, name := range slices.Sorted(maps.Keys(jails)) {
		procs, err := d.procs(ctx, jails[name])
		if err != nil {
			return nil, fmt.Errorf("running: %w", err)
		}
		if l := live(procs); len(l) > 0 {
			out[name], kids[name] = d.identify(name, l)
		}
	}
	for name, c := range before {
		if _, ok := out[name]; ok {
			continue
		}
		d.mu.Lock()
		unseen := !c.attached
		d.mu.Unlock()
		if unseen && !c.exited() {
			// Not reaped, so it exists, and not in its jail yet: jexec
			// enters it after it starts.
			out[name] = c.proc
			continue
		}
		if err := d.settleChild(ctx, name, c); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name := range d.adopted {
		if _, ok := out[name]; !ok {
			d.adoptedGoneLocked(name)
		}
	}
	for name, p := range out {
		if d.children[name] != nil {
			continue
		}
		if c, ok := before[name]; kids[name] || ok && c.proc.PID == p.PID {
			// A child of this driver (when the scan began, or started
			// while it ran) whose end was recorded (Stop, Destroy) while
			// the scan ran: it is gone, and adopting it would overwrite
			// its known exit as unknown once the next scan misses it.
			delete(out, name)
			continue
		}
		d.adopted[name] = p
	}
	return out, nil
}

// identify returns the identity of a running instance whose jail holds the
// live processes l, and whether it is a child of this driver.
func (d *Driver) identify(name string, l []psEntry) (nodeexec.Process, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.children[name]; c != nil {
		// The jail outlived the first process only if another process
		// lives in it: ps may have listed the first one just before it
		// ended and was reaped.
		if c.exited() && slices.ContainsFunc(l, func(e psEntry) bool { return e.PID != c.proc.PID }) {
			c.detached = true
		}
		return c.proc, true
	}
	r := d.records[name]
	if r != nil && r.Leader != nil {
		return nodeexec.Process{PID: r.Leader.PID, StartTime: uint64(r.Leader.Start), SpecHash: r.SpecHash, Started: time.Unix(r.Leader.Start, 0)}, false
	}
	// A jail of Keel's with no record of its start: its oldest process.
	oldest := slices.MinFunc(l, func(a, b psEntry) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return a.PID - b.PID
	})
	p := nodeexec.Process{PID: oldest.PID, StartTime: uint64(oldest.Start.Unix()), Started: oldest.Start}
	if r != nil {
		p.SpecHash = r.SpecHash
	}
	return p, false
}

// settleChild records the exit of a child whose jail no longer runs: it
// waits for the reaper (the process is gone or a zombie about to be
// reaped).
func (d *Driver) settleChild(ctx context.Context, name string, c *child) error {
	select {
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.children[name] != c {
		return nil
	}
	e := nodeexec.Exit{Code: c.code, Known: true, At: c.at}
	if c.detached {
		e = nodeexec.Exit{Code: -1, Known: false, At: d.now()}
	}
	d.exits[name] = e
	delete(d.children, name)
	return nil
}

// settle records the end of an instance known not to run.
func (d *Driver) settle(ctx context.Context, name string) error {
	d.mu.Lock()
	c := d.children[name]
	d.mu.Unlock()
	if c != nil {
		if err := d.settleChild(ctx, name, c); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.adopted[name]; ok {
		d.adoptedGoneLocked(name)
	}
	return nil
}

// adoptedGoneLocked records that an adopted instance stopped running, with
// an exit the driver could not see.
func (d *Driver) adoptedGoneLocked(name string) {
	delete(d.adopted, name)
	d.exits[name] = nodeexec.Exit{Code: -1, Known: false, At: d.now()}
}

// Exited implements nodeexec.Instances: Known with the status of the first
// process for workloads this driver started and that ended with it;
// Known=false (code -1) for adopted ones, and for ones whose jail outlived
// the first process. An end is recorded when Running, Stop, Start or
// Destroy finds the jail empty.
func (d *Driver) Exited(name string) (nodeexec.Exit, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.exits[name]
	return e, ok
}

// runningProcs returns the jail's JID (0 when there is no jail) and the
// instance's live processes (see liveProcs).
func (d *Driver) runningProcs(ctx context.Context, name string) (int, []psEntry, error) {
	jid, ok, err := d.jid(ctx, name)
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		jid = 0
	}
	l, err := d.liveProcs(ctx, name, jid)
	return jid, l, err
}

// liveProcs returns the instance's live processes: those that are not
// zombies in its jail, and its workload's first process while ps has never
// shown it there and the driver has not reaped it (just started, jexec may
// not have entered the jail yet: it must count, or a second copy could
// start).
func (d *Driver) liveProcs(ctx context.Context, name string, jid int) ([]psEntry, error) {
	var procs []psEntry
	if jid > 0 {
		var err error
		if procs, err = d.procs(ctx, jid); err != nil {
			return nil, err
		}
	}
	l := live(procs)
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.children[name]
	if c == nil || c.attached {
		return l, nil
	}
	if slices.ContainsFunc(procs, func(e psEntry) bool { return e.PID == c.proc.PID }) {
		c.attached = true
	} else if !c.exited() {
		l = append(l, psEntry{PID: c.proc.PID, State: "?", Start: c.proc.Started})
	}
	return l, nil
}

// Start implements nodeexec.Instances, in the order of
// docs/freebsd-notes.md §1.9: the root (a ZFS clone of the image's newest
// keel snapshot, kept when it exists), the jail (jail -c, kept when it
// exists), the volumes (nullfs), the network (vnet jails: the bridge, its
// gateway alias, an epair), the rctl limits, and the workload (jexec, a
// supervised child). Each step is idempotent, so a jail that stopped (or a
// host that rebooted) is started again the same way. When a provision that
// created the root fails, everything is undone in the order of §1.8.
//
// The workload runs as `jexec keel-<name> /usr/bin/env -i <env> <command>`:
// no shell, an environment of its own (never the agent's), stdin
// /dev/null, stdout and stderr appended to its log files.
func (d *Driver) Start(ctx context.Context, spec nodeexec.InstanceSpec) (nodeexec.Process, error) {
	name := spec.Name
	if err := checkName("instance", name); err != nil {
		return nodeexec.Process{}, err
	}
	if err := d.checkSpec(spec); err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	argv, env, err := d.workloadArgv(spec)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	rules, err := limitRules(name, spec.Spec.Resources)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()

	jid, l, err := d.runningProcs(ctx, name)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	if len(l) > 0 {
		p, _ := d.identify(name, l)
		return p, fmt.Errorf("start %s: pid %d: %w", name, p.PID, nodeexec.ErrAlreadyRunning)
	}
	if err := d.settle(ctx, name); err != nil {
		return nodeexec.Process{}, err
	}
	if len(rules) > 0 {
		if err := d.checkRacct(ctx); err != nil {
			return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
		}
	}

	rec := d.record(name)
	if rec == nil {
		rec = &instanceRecord{Instance: name}
	}
	rec.SpecHash, rec.Leader, rec.Env = spec.SpecHash, nil, env
	if err := d.saveRecord(rec); err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	created, err := d.cloneRoot(ctx, name, spec.Spec.Image)
	if err == nil {
		// Into the root itself, before the volumes are mounted (render
		// keeps artifacts and volumes apart).
		err = oci.PlaceArtifacts(ctx, d.hostPath(d.rootfs(name)), spec.Artifacts, spec.MaxUnpacked)
	}
	if err == nil {
		jid, err = d.provision(ctx, spec, rec, jid, rules)
	}
	if err != nil {
		if created {
			// Also when ctx ended (the agent stopping mid-start): the
			// new root goes, not left for a later start to find.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			uerr := d.teardown(uctx, name)
			cancel()
			if uerr != nil {
				d.log.Warn("undoing a failed provision", "instance", name, "err", uerr)
			}
		}
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	p, err := d.startWorkload(ctx, spec, rec, jid, argv)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// provision makes the jail, its volumes, network and limits, on a root
// that exists. It returns the jail's JID.
func (d *Driver) provision(ctx context.Context, spec nodeexec.InstanceSpec, rec *instanceRecord, jid int, rules []rctlRule) (int, error) {
	name := spec.Name
	if jid == 0 {
		if err := d.createJail(ctx, name, spec.Spec.Network.VNet); err != nil {
			return 0, err
		}
		var ok bool
		var err error
		if jid, ok, err = d.jid(ctx, name); err != nil {
			return 0, err
		} else if !ok {
			return 0, fmt.Errorf("jail %s was created but jls does not list it", jailName(name))
		}
	}
	if err := d.mountVolumes(ctx, spec); err != nil {
		return 0, err
	}
	if spec.Spec.Network.VNet {
		if err := d.attach(ctx, spec, rec); err != nil {
			return 0, err
		}
	}
	if err := d.applyRules(ctx, name, rules); err != nil {
		return 0, err
	}
	return jid, nil
}

// startWorkload runs the instance's command in its jail and supervises it.
func (d *Driver) startWorkload(ctx context.Context, spec nodeexec.InstanceSpec, rec *instanceRecord, jid int, argv []string) (nodeexec.Process, error) {
	name := spec.Name
	dir := d.instanceDir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nodeexec.Process{}, err
	}
	d.capLogs(name)
	stdout, err := logfile.Open(logfile.Path(dir, "stdout"))
	if err != nil {
		return nodeexec.Process{}, err
	}
	defer stdout.Close()
	stderr, err := logfile.Open(logfile.Path(dir, "stderr"))
	if err != nil {
		return nodeexec.Process{}, err
	}
	defer stderr.Close()
	p, err := d.runner.Start(argv, stdout, stderr)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("jexec %s: %w", jailName(name), err)
	}
	c := &child{p: p, done: make(chan struct{})}
	go d.reap(c)

	pid, started := p.Pid(), d.now()
	if procs, err := d.procs(ctx, jid); err != nil {
		d.log.Warn("reading the start time of a workload", "instance", name, "pid", pid, "err", err)
	} else if i := slices.IndexFunc(procs, func(e psEntry) bool { return e.PID == pid }); i >= 0 {
		started, c.attached = procs[i].Start, true
	}
	started = started.Truncate(time.Second)
	c.proc = nodeexec.Process{PID: pid, StartTime: uint64(started.Unix()), SpecHash: spec.SpecHash, Started: started}
	rec.Leader = &leader{PID: pid, Start: started.Unix()}
	if err := d.saveRecord(rec); err != nil {
		// The workload runs and is supervised; only a restarted agent
		// would not know which process started first.
		d.log.Warn("recording a workload", "instance", name, "err", err)
	}
	d.mu.Lock()
	d.children[name] = c
	delete(d.adopted, name)
	d.mu.Unlock()
	return c.proc, nil
}

// defaultPath is the PATH of a workload whose spec sets none: FreeBSD's
// standard one (/etc/login.conf's default class).
const defaultPath = "/sbin:/bin:/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin"

// workloadArgv builds the jexec argv of an instance, and returns the
// environment it passes (NAME=value, sorted). jexec without -l would pass
// on the agent's environment (docs/freebsd-notes.md §1.6), so env(1) -i
// replaces it with the instance's own: PATH (defaultPath unless the spec
// sets it), HOME=/root, the spec's env, and the KEEL_ variables of
// nodeexec.InstanceEnv, where KEEL_VOLUME_<NAME> is the volume's mount path
// inside the jail. KEEL_DRIVER_ROOT is left out: jails are found by name.
func (d *Driver) workloadArgv(spec nodeexec.InstanceSpec) (argv, env []string, err error) {
	if len(spec.Spec.Command) == 0 {
		return nil, nil, errors.New("no command")
	}
	vars, err := nodeexec.InstanceEnv(spec, "/root", "")
	if err != nil {
		return nil, nil, err
	}
	delete(vars, nodeexec.EnvDriverRoot)
	for _, v := range spec.Spec.Volumes {
		vars[nodeexec.VolumeVar(spec, v.Name)] = cleanMountPath(v.MountPath)
	}
	if vars["PATH"] == "" {
		vars["PATH"] = defaultPath
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, nil, fmt.Errorf("environment variable %q cannot be passed", k)
		}
		env = append(env, k+"="+vars[k])
	}
	argv, err = jexecArgv(spec.Name, env, spec.Spec.Command)
	return argv, env, err
}

// jexecArgv is `jexec keel-<name> /usr/bin/env -i <env> <command>`, the
// command expanded with env (nodeexec.ExpandArgs), for the workload and
// the exec checks alike.
func jexecArgv(name string, env, command []string) ([]string, error) {
	vars := make(map[string]string, len(env))
	argv := []string{"jexec", jailName(name), "/usr/bin/env", "-i"}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("environment variable %q cannot be passed", k)
		}
		vars[k] = v
		argv = append(argv, kv)
	}
	cmd := nodeexec.ExpandArgs(command, vars)
	if cmd[0] == "" || strings.Contains(cmd[0], "=") {
		// env(1) would take it for a variable.
		return nil, fmt.Errorf("the command's first element %q is empty or contains '='", cmd[0])
	}
	for _, a := range cmd {
		if strings.ContainsRune(a, 0) {
			return nil, errors.New("the command contains a NUL byte")
		}
	}
	return append(argv, cmd...), nil
}

// checkSpec validates what Start turns into datasets, paths and argv.
func (d *Driver) checkSpec(spec nodeexec.InstanceSpec) error {
	if strings.HasPrefix(spec.Spec.Image, render.OCIPrefix) {
		// Its digest names the image's dataset (ociDataset checks it
		// again).
		if _, err := render.ParseImage(spec.Spec.Image); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	} else if err := render.CheckImage(spec.Spec.Image); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	for _, v := range spec.Spec.Volumes {
		if err := checkName("volume", v.Name); err != nil {
			return err
		}
		if err := checkMountPath(v.MountPath); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		p, ok := spec.Volumes[v.Name]
		if !ok {
			return fmt.Errorf("volume %s has no host path (EnsureVolume it first)", v.Name)
		}
		if p != d.volumePath(v.Name) {
			return fmt.Errorf("volume %s: its path is %s, not %s", v.Name, d.volumePath(v.Name), p)
		}
	}
	if spec.Spec.Network.VNet {
		if _, _, err := d.jailNet(spec); err != nil {
			return err
		}
	}
	return nil
}

// checkMountPath refuses what render refuses, and white space and control
// characters too: mount -p prints paths unescaped (sbin/mount/mount.c
// putfsent), so a mount on such a path could not be found again.
func checkMountPath(p string) error {
	if err := render.CheckMountPath(p); err != nil {
		return err
	}
	if strings.IndexFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return fmt.Errorf("%q contains white space or a control character, which mount -p cannot show", p)
	}
	return nil
}

// jailNet returns a vnet jail's bridge and address with its /24.
func (d *Driver) jailNet(spec nodeexec.InstanceSpec) (string, netip.Prefix, error) {
	bridge := spec.Spec.Network.Bridge
	if bridge == "" {
		bridge = d.bridge
	}
	if err := render.CheckBridge(bridge); err != nil {
		return "", netip.Prefix{}, err
	}
	a := spec.Address
	if !a.IsValid() || !a.Is4() {
		return "", netip.Prefix{}, fmt.Errorf("a vnet jail needs an IPv4 address, not %v", a)
	}
	p := netip.PrefixFrom(a, 24)
	net := p.Masked().Addr()
	if a == net || a == net.Next() || a == gatewayBroadcast(p) {
		return "", netip.Prefix{}, fmt.Errorf("address %s is the network, gateway or broadcast address of %s", a, p.Masked())
	}
	return bridge, p, nil
}

// gatewayBroadcast is the last address of a /24.
func gatewayBroadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	b[3] = 255
	return netip.AddrFrom4(b)
}

// Stop implements nodeexec.Instances: `kill -s TERM` to every live
// process of the jail (ps -J), up to grace for them to end, then `kill -s
// KILL`, and it returns once the jail holds none. The jail, its root,
// volumes and network stay for the next Start; Destroy removes them. It
// works on adopted instances too.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()
	jid, l, err := d.runningProcs(ctx, name)
	if err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	if len(l) > 0 {
		if err := d.endProcs(ctx, name, jid, l, grace); err != nil {
			return fmt.Errorf("stop %s: %w", name, err)
		}
	}
	return d.settle(ctx, name)
}

// endProcs signals the jail's live processes l with TERM, waits up to
// grace, then kills what is left, until the jail holds no live process.
func (d *Driver) endProcs(ctx context.Context, name string, jid int, l []psEntry, grace time.Duration) error {
	if err := d.signal(ctx, "TERM", l); err != nil {
		return err
	}
	l, err := d.waitEmpty(ctx, name, jid, time.Now().Add(grace))
	for err == nil && len(l) > 0 {
		if err = d.signal(ctx, "KILL", l); err == nil {
			// Again after a while: what forked meanwhile escaped the
			// last signal.
			l, err = d.waitEmpty(ctx, name, jid, time.Now().Add(time.Second))
		}
	}
	return err
}

// signal sends sig to the processes: `kill -s <sig> <pid>...` (bin/kill/
// kill.c). A process that ended since the listing is not an error.
func (d *Driver) signal(ctx context.Context, sig string, procs []psEntry) error {
	argv := []string{"kill", "-s", sig}
	for _, p := range procs {
		argv = append(argv, strconv.Itoa(p.PID))
	}
	_, err := d.tolerate(ctx, msgNoProcess, argv...)
	return err
}

// waitEmpty polls the jail until it holds no live process, until the
// deadline (none when zero; real time, whatever Options.Now says) or until
// ctx ends; it returns the live
// processes last seen. A process that is not the agent's child cannot be
// waited for.
func (d *Driver) waitEmpty(ctx context.Context, name string, jid int, deadline time.Time) ([]psEntry, error) {
	interval := 5 * time.Millisecond
	for {
		l, err := d.liveProcs(ctx, name, jid)
		if err != nil || len(l) == 0 {
			return l, err
		}
		wait := interval
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return l, nil
			}
			wait = min(wait, left)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return l, ctx.Err()
		}
		interval = min(2*interval, 100*time.Millisecond)
	}
}

// Destroy implements nodeexec.Instances: it removes the jail, its network,
// mounts, root dataset and rctl rules in the order of
// docs/freebsd-notes.md §1.8 and §11, each step tolerating what is already
// gone, then the instance's record and logs. Volumes are unmounted, never
// destroyed. It fails, with an error wrapping nodeexec.ErrBusy, while the
// instance runs.
func (d *Driver) Destroy(ctx context.Context, name string) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()
	_, l, err := d.runningProcs(ctx, name)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	if len(l) > 0 {
		return fmt.Errorf("destroy %s: it runs (pid %d); stop it first: %w", name, l[0].PID, nodeexec.ErrBusy)
	}
	if err := d.settle(ctx, name); err != nil {
		return err
	}
	if err := d.teardown(ctx, name); err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	return nil
}

// teardown removes everything of an instance but its volumes, in the safe
// order (docs/freebsd-notes.md §1.8, §11): the epair (before jail -r, or
// it would outlive the jail: §4.5), jail -r, the root's devfs, the reaping
// of its workload, the volumes' nullfs mounts (before the root: §10.20),
// the root dataset (retried while busy: §2.4), the rctl rules (they are
// keyed by name and would bind a new jail of the same name: §5), then the
// gateway alias when no instance uses its subnet any more, and last the
// record. Each step tolerates what is already gone; the record stays until
// every step succeeded, so a later Destroy finishes the work.
func (d *Driver) teardown(ctx context.Context, name string) error {
	rec := d.record(name)
	if rec != nil && rec.Epair > 0 {
		if _, err := d.tolerate(ctx, msgNoInterface, "ifconfig", epairA(rec.Epair), "destroy"); err != nil {
			return err
		}
	}
	if err := d.removeJail(ctx, name); err != nil {
		return err
	}
	mounts, err := d.mounts(ctx)
	if err != nil {
		return err
	}
	root := d.rootfs(name)
	dev := root + "/dev"
	// Once per mount: a jail -c on a root whose devfs outlived an earlier
	// jail (jail -r leaves it, docs/freebsd-notes.md §10.23) stacked a
	// second one (usr.sbin/jail/command.c IP_MOUNT_DEVFS does not look).
	for _, m := range mounts {
		if m.Point == dev {
			if err := d.unmount(ctx, dev); err != nil {
				return err
			}
		}
	}
	if err := d.settle(ctx, name); err != nil {
		return err
	}
	var inRoot []string
	for _, m := range mounts {
		if m.Point != dev && strings.HasPrefix(m.Point, root+"/") {
			inRoot = append(inRoot, m.Point)
		}
	}
	// Deepest first: a volume may be mounted inside another.
	slices.SortFunc(inRoot, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, p := range inRoot {
		errs = append(errs, d.unmount(ctx, p))
	}
	if err := errors.Join(errs...); err != nil {
		return err // never destroy a root with a volume still mounted in it
	}
	if err := d.destroyDataset(ctx, d.jailDataset(name), false); err != nil {
		return err
	}
	if _, err := d.tolerate(ctx, msgNoRules, "rctl", "-r", "jail:"+jailName(name)); err != nil {
		return err
	}
	if rec != nil && rec.Address != "" {
		if err := d.releaseGateway(ctx, rec); err != nil {
			return err
		}
	}
	return d.forget(name)
}

// Apply implements nodeexec.Instances: the jail's rctl rules become those
// of r (see limitRules), adding and removing only what differs, so a pass
// that changes nothing runs no changing command. It returns an error
// wrapping nodeexec.ErrNotFound when the jail does not exist, and
// ErrRacctDisabled when limits are wanted and the host has none.
func (d *Driver) Apply(ctx context.Context, name string, r render.Resources) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	rules, err := limitRules(name, r)
	if err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()
	if _, ok, err := d.jid(ctx, name); err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	} else if !ok {
		return fmt.Errorf("apply %s: no jail %s: %w", name, jailName(name), nodeexec.ErrNotFound)
	}
	if len(rules) > 0 {
		if err := d.checkRacct(ctx); err != nil {
			return fmt.Errorf("apply %s: %w", name, err)
		}
	}
	if err := d.applyRules(ctx, name, rules); err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}
	return nil
}

// Logs implements nodeexec.Instances: the tail of the instance's stdout
// and stderr (logfile.Tail). It returns an error wrapping
// nodeexec.ErrNotFound for an instance the driver holds nothing of.
func (d *Driver) Logs(name string, limit int) ([]byte, error) {
	if err := checkName("instance", name); err != nil {
		return nil, err
	}
	return nodeexec.InstanceLogs(name, d.instanceDir(name), limit)
}

// capLogs caps both of an instance's logs; a failure is logged, not
// returned.
func (d *Driver) capLogs(name string) {
	if err := logfile.CapAll(d.instanceDir(name), d.logMax); err != nil {
		d.log.Warn("capping an instance's log", "instance", name, "err", err)
	}
}
