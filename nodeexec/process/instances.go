package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"syscall"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/logfile"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/nodeexec/pgroup"
	"github.com/keel-dev/keel/render"
)

// The environment variables by which the driver recognises its instances.
const (
	envDriverRoot   = nodeexec.EnvDriverRoot
	envInstance     = nodeexec.EnvInstance
	envSpecHash     = nodeexec.EnvSpecHash
	envVolumePrefix = nodeexec.EnvVolumePrefix
)

// child is an instance this Driver started. Its reaper goroutine records
// the exit and then closes done.
type child struct {
	cmd     *exec.Cmd
	proc    nodeexec.Process
	volumes []string
	done    chan struct{}

	// sigMu orders signals against reaping: until reaped is set, the
	// leader's PID, and so its group's number, cannot be reused.
	sigMu  gosync.Mutex
	reaped bool
}

// signal sends sig to the child's process group unless it has been reaped.
func (c *child) signal(sig syscall.Signal) error {
	c.sigMu.Lock()
	defer c.sigMu.Unlock()
	if c.reaped {
		return nil
	}
	return killGroup(c.proc.PID, sig)
}

// found is a running instance as the driver sees it.
type found struct {
	proc    nodeexec.Process
	volumes []string // host paths of the volumes it was started with
}

// procKey identifies a process for good: a PID is reused, a PID with its
// start time is not.
type procKey struct {
	pid   int
	start uint64
}

// procInfo is the scan's memory of a process-group leader: whether it is
// one of this driver's instances, and which.
type procInfo struct {
	ours bool
	m    marker
}

// Running lists the instances that run now, from /proc: this driver's
// children, and the process-group leaders whose environment names this
// state directory (processes started by an earlier agent, which the driver
// then adopts). A zombie counts as exited. When an instance started by this
// driver is no longer listed, Exited already reports its exit.
//
// Running also caps the logs of every running instance at Options.LogMax
// (see Logs), so a reconciler that calls it each pass keeps logs bounded.
//
// Each call reads /proc/<pid>/stat of every process; the environment of a
// process is read once and remembered by PID and start time.
func (d *Driver) Running(ctx context.Context) (map[string]nodeexec.Process, error) {
	all, err := d.running(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]nodeexec.Process, len(all))
	for name, f := range all {
		out[name] = f.proc
		d.capLogs(name)
	}
	return out, nil
}

// running is Running without the log maintenance.
func (d *Driver) running(ctx context.Context) (map[string]found, error) {
	all, err := d.scan()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	children := maps.Clone(d.children)
	d.mu.Unlock()
	for name, c := range children {
		f, seen := all[name]
		if seen && f.proc.PID == c.proc.PID && f.proc.StartTime == c.proc.StartTime || isAlive(c.proc.PID, c.proc.StartTime) {
			all[name] = found{proc: c.proc, volumes: c.volumes}
			continue
		}
		// It exited (perhaps a zombie its reaper is about to collect):
		// wait for the reaper, so that Exited knows as soon as Running
		// stops listing the instance.
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if all[name].proc.PID == c.proc.PID {
			delete(all, name)
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for name, p := range d.adopted {
		if f, ok := all[name]; !ok || f.proc.PID != p.PID || f.proc.StartTime != p.StartTime {
			d.adoptedGoneLocked(name)
		}
	}
	for name, f := range all {
		if c, ok := d.children[name]; ok && c.proc.PID == f.proc.PID {
			continue
		}
		if cur, ok := d.adopted[name]; !ok || cur != f.proc {
			// Found by the scan, not a child now: an earlier agent's, or a
			// child this driver started that exited and was reaped since
			// the scan (its reaper drops it from children once it is
			// gone): that one is not adopted, or its known exit would be
			// overwritten as unknown once the next scan misses it.
			if !isAlive(f.proc.PID, f.proc.StartTime) {
				delete(all, name)
				continue
			}
		}
		d.adopted[name] = f.proc
	}
	return all, nil
}

// adoptedGoneLocked records that the leader of the adopted instance name
// has gone, with an exit the driver could not see, and kills what is left
// of its group.
func (d *Driver) adoptedGoneLocked(name string) {
	killLeftovers(d.adopted[name])
	delete(d.adopted, name)
	d.exits[name] = nodeexec.Exit{Code: -1, Known: false, At: d.now()}
}

// scan finds the process-group leaders whose environment marks them as
// instances of this state directory. If two claim one instance (its
// command started a new process group of its own), the older is the
// instance.
//
// A process in the middle of execve shows an empty environment for a
// moment (its new image's is not set up yet): an empty read is never
// remembered, and is read again a few times, a little later, before the
// scan gives up on it for this time. Otherwise an instance whose command
// execs (`sh -c '...; exec app'`) would go unrecognised for good by an
// agent whose first scan caught it then, which would start it again.
func (d *Driver) scan() (map[string]found, error) {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("running: %w", err)
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil, fmt.Errorf("running: reading /proc: %w", err)
	}

	d.scanMu.Lock()
	defer d.scanMu.Unlock()
	seen := make(map[procKey]bool, len(d.cache))
	all := map[string]found{}
	add := func(pid int, st procStat, info procInfo) {
		if !info.ours {
			return
		}
		if prev, dup := all[info.m.Instance]; dup && prev.proc.StartTime <= st.StartTime {
			return
		}
		all[info.m.Instance] = found{
			proc: nodeexec.Process{
				PID:       pid,
				StartTime: st.StartTime,
				SpecHash:  info.m.SpecHash,
				Started:   d.startedAt(st.StartTime),
			},
			volumes: info.m.Volumes,
		}
	}
	var unsure []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.PGID != pid || !st.alive() {
			continue // gone since the listing, not a group leader, or a zombie
		}
		key := procKey{pid, st.StartTime}
		seen[key] = true
		info, ok := d.cache[key]
		if !ok {
			var sure bool
			if info, sure = d.identify(pid); !sure {
				unsure = append(unsure, pid)
				continue
			}
			d.cache[key] = info
		}
		add(pid, st, info)
	}
	for wait := time.Millisecond; len(unsure) > 0 && wait <= maxExecWait; wait *= 2 {
		time.Sleep(wait) // an execve in progress: nothing to wait on but time
		var still []int
		for _, pid := range unsure {
			st, err := readStat(pid)
			if err != nil || st.PGID != pid || !st.alive() {
				continue
			}
			info, sure := d.identify(pid)
			if !sure {
				still = append(still, pid)
				continue
			}
			d.cache[procKey{pid, st.StartTime}] = info
			add(pid, st, info)
		}
		unsure = still
	}
	maps.DeleteFunc(d.cache, func(k procKey, _ procInfo) bool { return !seen[k] })
	return all, nil
}

// maxExecWait bounds the last wait of scan's re-reads of an empty
// environment: 1+2+4+8 ms in all. A process whose environment stays empty
// (one started with none) costs each scan that much.
const maxExecWait = 8 * time.Millisecond

// identify reads a process's environment to learn whether it is one of
// this driver's instances. A process whose environment cannot be read
// (another user's, or one that made itself non-dumpable) is not. sure is
// false when the environment read empty: the process may be in the middle
// of an execve, and should be read again.
func (d *Driver) identify(pid int) (info procInfo, sure bool) {
	d.environReads.Add(1)
	b, err := d.readEnviron(pid)
	if err != nil {
		return procInfo{}, true
	}
	if len(b) == 0 {
		return procInfo{}, false
	}
	m := parseEnviron(b)
	ours := m.Root == d.root && checkName("instance", m.Instance) == nil
	return procInfo{ours: ours, m: m}, true
}

// startedAt turns a starttime in clock ticks after boot into a wall time.
func (d *Driver) startedAt(ticks uint64) time.Time {
	return d.bootTime.Add(time.Duration(ticks) * (time.Second / clockTicks))
}

// Exited implements nodeexec.Instances: Known with the real status for
// processes this driver started, Known=false (Code -1) for adopted ones
// that are gone. It returns the last exit recorded, even if the instance
// has been started again since.
func (d *Driver) Exited(name string) (nodeexec.Exit, bool) {
	d.mu.Lock()
	c := d.children[name]
	a, adopted := d.adopted[name]
	d.mu.Unlock()
	switch {
	case c != nil && !isAlive(c.proc.PID, c.proc.StartTime):
		<-c.done // exited: its reaper is about to record it
	case adopted && !isAlive(a.PID, a.StartTime):
		d.mu.Lock()
		if cur, ok := d.adopted[name]; ok && cur == a {
			d.adoptedGoneLocked(name)
		}
		d.mu.Unlock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.exits[name]
	return e, ok
}

// Env returns the environment computed for the named instance's last
// Start by this driver (nil if it has not started it), sorted.
func (d *Driver) Env(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.env[name])
}

// Start implements nodeexec.Instances. On first creation the instance's
// root is a copy of images/<Spec.Image> when that directory exists, else
// empty. The command runs with:
//   - argv: Spec.Command, each ${NAME} or $NAME replaced by the instance's
//     environment variable NAME ("" when unset) and $$ by a single $;
//     anything else after a $ (such as $1 or ${x:-y}) is left for the
//     command itself. argv[0] without a slash is looked up in the
//     instance's PATH; a relative one with a slash is relative to root/.
//   - environment: see instanceEnv.
//   - working directory root/, stdin /dev/null, stdout and stderr appended
//     to stdout.log and stderr.log (files, never pipes, so the instance
//     outlives the agent), in a process group of its own.
func (d *Driver) Start(ctx context.Context, spec nodeexec.InstanceSpec) (nodeexec.Process, error) {
	name := spec.Name
	if err := checkName("instance", name); err != nil {
		return nodeexec.Process{}, err
	}
	if len(spec.Spec.Command) == 0 {
		return nodeexec.Process{}, fmt.Errorf("start %s: no command", name)
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()

	running, err := d.running(ctx)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	if f, ok := running[name]; ok {
		return f.proc, fmt.Errorf("start %s: pid %d: %w", name, f.proc.PID, nodeexec.ErrAlreadyRunning)
	}

	for _, p := range spec.Volumes {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return nodeexec.Process{}, fmt.Errorf("start %s: volume %s is not a directory", name, p)
		}
	}
	root, err := d.ensureRoot(name, spec.Spec.Image)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	if err := oci.PlaceArtifacts(ctx, root, spec.Artifacts, spec.MaxUnpacked); err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	env, err := instanceEnv(spec, root, d.root, os.Getenv("PATH"))
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	argv := nodeexec.ExpandArgs(spec.Spec.Command, env)
	if slices.Equal(spec.Spec.Command, render.DefaultCommand) {
		// The default boots the image's own init, as a FreeBSD jail does.
		// Here there is no chroot: run the root's /etc/rc if the image has
		// one, and never the host's.
		rc := filepath.Join(root, "etc", "rc")
		if _, err := os.Stat(rc); err != nil {
			return nodeexec.Process{}, fmt.Errorf("start %s: no spec.command, and the image has no /etc/rc to boot: the process driver needs an explicit command", name)
		}
		argv = []string{"/bin/sh", rc}
	}
	path, err := lookPath(argv[0], env["PATH"], root)
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}

	dir := d.instanceDir(name)
	d.capLogs(name)
	stdout, err := logfile.Open(logfile.Path(dir, "stdout"))
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	defer stdout.Close()
	stderr, err := logfile.Open(logfile.Path(dir, "stderr"))
	if err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	defer stderr.Close()

	envList := envSlice(env)
	// Not exec.CommandContext: the instance must outlive ctx and the agent.
	cmd := &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         envList,
		Dir:         root,
		Stdout:      stdout, // *os.File: handed to the child as is, no pipe
		Stderr:      stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		return nodeexec.Process{}, fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	// Not reaped yet, so /proc/<pid> exists even if it already exited.
	st, err := readStat(pid)
	if err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nodeexec.Process{}, fmt.Errorf("start %s: reading its start time: %w", name, err)
	}
	c := &child{
		cmd: cmd,
		proc: nodeexec.Process{
			PID:       pid,
			StartTime: st.StartTime,
			SpecHash:  spec.SpecHash,
			Started:   d.startedAt(st.StartTime),
		},
		volumes: volumePaths(env),
		done:    make(chan struct{}),
	}
	d.mu.Lock()
	d.children[name] = c
	delete(d.adopted, name)
	d.env[name] = envList
	d.mu.Unlock()
	go d.reap(name, c)
	return c.proc, nil
}

// reap waits for a child, kills what is left of its process group (an
// instance is its group, as a container's processes end with its init),
// reaps it and records its exit.
func (d *Driver) reap(name string, c *child) {
	if err := pgroup.WaitExited(c.proc.PID); err == nil {
		_ = c.signal(syscall.SIGKILL)
		c.sigMu.Lock()
		_ = c.cmd.Wait() // returns at once; the status is in ProcessState
		c.reaped = true
		c.sigMu.Unlock()
	} else {
		// Without waitid, Wait blocks until the exit and must not hold
		// sigMu meanwhile, or Stop could not signal.
		_ = c.cmd.Wait()
		c.sigMu.Lock()
		c.reaped = true
		c.sigMu.Unlock()
	}
	code := -1
	if ps := c.cmd.ProcessState; ps != nil {
		code = ps.ExitCode() // -1 when killed by a signal
	}
	d.mu.Lock()
	d.exits[name] = nodeexec.Exit{Code: code, Known: true, At: d.now()}
	if d.children[name] == c {
		delete(d.children, name)
	}
	d.mu.Unlock()
	close(c.done)
}

// Stop implements nodeexec.Instances: SIGTERM to the instance's process
// group, up to grace for its leader to exit, then SIGKILL to the group. When
// the leader is gone, whatever is left in its group is killed too, and so is
// any process the command detached into a group of its own (it carries the
// instance's environment). It works on adopted instances.
func (d *Driver) Stop(ctx context.Context, name string, grace time.Duration) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()

	// Usually one round. More when the command detached a process into a
	// group of its own: it carries the instance's environment, so it is
	// the instance once the first group is gone.
	for range maxStopRounds {
		running, err := d.running(ctx)
		if err != nil {
			return fmt.Errorf("stop %s: %w", name, err)
		}
		f, ok := running[name]
		if !ok {
			return nil
		}
		p := f.proc
		d.mu.Lock()
		c := d.children[name]
		d.mu.Unlock()
		if c != nil && c.proc != p {
			c = nil
		}
		if c != nil {
			err = d.stopChild(ctx, c, grace)
		} else {
			err = d.stopAdopted(ctx, name, p, grace)
		}
		if err != nil {
			return fmt.Errorf("stop %s: %w", name, err)
		}
	}
	return fmt.Errorf("stop %s: its processes keep detaching into new process groups", name)
}

// maxStopRounds bounds how many process groups Stop ends for one instance.
const maxStopRounds = 10

// stopChild stops an instance this driver started; its reaper kills the
// rest of the group once the leader is gone.
func (d *Driver) stopChild(ctx context.Context, c *child, grace time.Duration) error {
	if err := c.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if waitDone(ctx, c.done, grace) {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := c.signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitDone waits up to d for done; it reports whether done closed.
func waitDone(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// stopAdopted stops an instance an earlier agent started. Not being its
// parent, the driver cannot wait for it: it polls, and it checks the
// leader's identity before each signal.
func (d *Driver) stopAdopted(ctx context.Context, name string, p nodeexec.Process, grace time.Duration) error {
	if isAlive(p.PID, p.StartTime) {
		if err := killGroup(p.PID, syscall.SIGTERM); err != nil {
			return err
		}
	}
	graceCtx, cancel := context.WithTimeout(ctx, grace)
	err := pollGone(graceCtx, p.PID, p.StartTime)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if isAlive(p.PID, p.StartTime) {
			if err := killGroup(p.PID, syscall.SIGKILL); err != nil {
				return err
			}
		}
		if err := pollGone(ctx, p.PID, p.StartTime); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur, ok := d.adopted[name]; ok && cur == p {
		d.adoptedGoneLocked(name)
	} else {
		killLeftovers(p)
	}
	return nil
}

// killLeftovers kills what is left of the process group of an adopted
// instance whose leader is gone. A group's number stays reserved while it
// has members, so the signal reaches only them, unless the PID already
// belongs to a new process: then the group had emptied and is left alone.
func killLeftovers(p nodeexec.Process) {
	if st, err := readStat(p.PID); err == nil && st.StartTime != p.StartTime {
		return
	}
	_ = killGroup(p.PID, syscall.SIGKILL)
}

// killGroup signals a process group; a group that no longer exists is not
// an error.
func killGroup(pgid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to process group %d: %w", sig, pgid, err)
	}
	return nil
}

// pollGone waits until the process is gone or a zombie. It polls: a
// process that is not our child cannot be waited for.
func pollGone(ctx context.Context, pid int, start uint64) error {
	interval := time.Millisecond
	for isAlive(pid, start) {
		t := time.NewTimer(interval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		interval = min(2*interval, 50*time.Millisecond)
	}
	return nil
}

// Destroy implements nodeexec.Instances: it removes instances/<name>, root
// and logs, never a volume. It fails, with an error wrapping
// nodeexec.ErrBusy, while the instance runs.
func (d *Driver) Destroy(ctx context.Context, name string) error {
	if err := checkName("instance", name); err != nil {
		return err
	}
	unlock := d.names.Lock("instance/" + name)
	defer unlock()
	running, err := d.running(ctx)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	if f, ok := running[name]; ok {
		return fmt.Errorf("destroy %s: it runs (pid %d); stop it first: %w", name, f.proc.PID, nodeexec.ErrBusy)
	}
	if err := removeTree(d.instanceDir(name)); err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	return nil
}

// ensureRoot creates the instance's directory and root on first use,
// seeded from the image when the state directory has it. The copy is made
// aside and renamed into place, so a crash never leaves a half-seeded root.
func (d *Driver) ensureRoot(name, image string) (string, error) {
	dir := d.instanceDir(name)
	root := filepath.Join(dir, "root")
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src, link := "", false
	if strings.HasPrefix(image, render.OCIPrefix) {
		ref, err := render.ParseImage(image)
		if err != nil {
			return "", err
		}
		img, err := d.ociImageDir(ref.Digest)
		if err != nil {
			return "", err
		}
		if _, err := readImageInfo(img); err != nil {
			return "", fmt.Errorf("image %s is not pulled on this node (%w)", image, err)
		}
		src, link = filepath.Join(img, "root"), true
	} else if image != "" {
		img, err := d.imageDir(image)
		if err != nil {
			return "", err
		}
		if fi, err := os.Stat(img); err == nil && fi.IsDir() {
			src = img
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("image %s: %w", image, err)
		}
	}
	if src == "" {
		return root, os.Mkdir(root, 0o755)
	}
	tmp := root + ".tmp"
	if err := removeTree(tmp); err != nil {
		return "", err
	}
	if err := copyTree(src, tmp, link); err != nil {
		return "", fmt.Errorf("seeding root from image %s: %w", image, err)
	}
	if err := os.Rename(tmp, root); err != nil {
		return "", err
	}
	return root, nil
}

// instanceEnv is the environment of an instance:
//
//	PATH                 the agent's (a default if it has none)
//	HOME                 the instance's root
//	Spec.Env             may override PATH and HOME, never a KEEL_ variable
//	KEEL_INSTANCE        the instance's name
//	KEEL_NODE            the node's name
//	KEEL_ADDRESS         the instance's address ("" when it has none)
//	KEEL_SERVICE         its Service ("" for a Jail)
//	KEEL_VOLUME_<NAME>   the host path of each volume; NAME is the volume's
//	                     name as the spec wrote it (for a Service replica,
//	                     without the "<replica>-" prefix), upper-cased, with
//	                     '-' turned into '_'
//	KEEL_DRIVER_ROOT     the state directory, by which Running finds it
//	KEEL_SPEC_HASH       the spec hash it was started with
func instanceEnv(spec nodeexec.InstanceSpec, root, stateDir, agentPath string) (map[string]string, error) {
	if agentPath == "" {
		agentPath = "/usr/local/bin:/usr/bin:/bin"
	}
	env, err := nodeexec.InstanceEnv(spec, root, stateDir)
	if err != nil {
		return nil, err
	}
	env["PATH"] = agentPath
	return env, nil
}

// volumePaths returns the volume paths in an instance's environment.
func volumePaths(env map[string]string) []string {
	var paths []string
	for k, v := range env {
		if strings.HasPrefix(k, envVolumePrefix) {
			paths = append(paths, v)
		}
	}
	slices.Sort(paths)
	return paths
}

// envSlice turns an environment into sorted NAME=value pairs.
func envSlice(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
