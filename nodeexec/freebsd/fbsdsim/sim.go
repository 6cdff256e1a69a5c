package fbsdsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/keel-dev/keel/nodeexec/freebsd"
)

// Options shape a new simulated host. Zero fields take the defaults.
type Options struct {
	// Pools are the ZFS pools, each mounted at /<pool>. Default: zroot.
	Pools []string
	// NCPU and PhysMem are hw.ncpu and hw.physmem. Default 4 and 8 GiB.
	NCPU, PhysMem string
	// Racct is kern.racct.enable ("0" or "1"). Default "1".
	Racct string
	// Forwarding is net.inet.ip.forwarding. Default "1".
	Forwarding string
	// Hostname is kern.hostname, inherited by jails. Default "fbsdsim".
	Hostname string
	// HostIfaces are the host's physical interfaces besides lo0.
	// Default: em0 with 192.0.2.10/24.
	HostIfaces []HostIface
	// NoPF simulates pf.ko not loaded: /dev/pf is missing.
	NoPF bool
	// StopTimeout is jail(8)'s stop.timeout: how long jail -r waits after
	// SIGTERM before removing the jail (killing what is left). Default
	// 10 s (DEFAULT_STOP_TIMEOUT in usr.sbin/jail/command.c).
	StopTimeout time.Duration
}

// HostIface is a host interface with its addresses.
type HostIface struct {
	Name  string
	Addrs []Addr
}

func (o Options) withDefaults() Options {
	if len(o.Pools) == 0 {
		o.Pools = []string{"zroot"}
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&o.NCPU, "4")
	def(&o.PhysMem, "8589934592")
	def(&o.Racct, "1")
	def(&o.Forwarding, "1")
	def(&o.Hostname, "fbsdsim")
	if o.HostIfaces == nil {
		o.HostIfaces = []HostIface{{Name: "em0", Addrs: []Addr{{IP: "192.0.2.10", Prefix: 24}}}}
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 10 * time.Second
	}
	return o
}

// store holds the State for one mode and serialises access to it.
type store interface {
	with(func(*State) error) error
}

type memStore struct {
	mu sync.Mutex
	st *State
}

func (m *memStore) with(fn func(*State) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fn(m.st)
}

// diskStore keeps the State in <root>/.fbsdsim/state.json and serialises
// every access with flock(2) on <root>/.fbsdsim/lock, so that the
// executables of the multi-call binary share it.
type diskStore struct {
	root string
	opts Options
}

func (d *diskStore) with(fn func(*State) error) error {
	dir := filepath.Join(d.root, ".fbsdsim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	st, err := readState(d.root)
	if errors.Is(err, os.ErrNotExist) {
		st = newState(d.opts)
		err = nil
	}
	if err != nil {
		return err
	}
	ferr := fn(st)
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "state.json")); err != nil {
		return err
	}
	return ferr
}

func readState(root string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(root, ".fbsdsim", "state.json"))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("fbsdsim state: %w", err)
	}
	return &st, nil
}

// Sim is a simulated FreeBSD host. It implements freebsd.Runner and is
// safe for concurrent use.
type Sim struct {
	root string
	opts Options
	st   store
	disk bool

	mu    sync.Mutex
	procs map[int]*simProc // in-process mode's processes by pid
}

// New returns an in-process simulator whose file system mirror lives
// under root (the driver's Options.Root).
func New(root string, opts Options) *Sim {
	opts = opts.withDefaults()
	return &Sim{root: root, opts: opts, st: &memStore{st: newState(opts)}, procs: map[int]*simProc{}}
}

// OnDisk returns a simulator acting on the executable mode's state under
// root (created with opts if it does not exist yet). Tests use it to
// prepare a host and to set hooks for the executables; the executables
// use it for every invocation.
func OnDisk(root string, opts Options) *Sim {
	opts = opts.withDefaults()
	return &Sim{root: root, opts: opts, st: &diskStore{root: root, opts: opts}, disk: true, procs: map[int]*simProc{}}
}

// Load reads the executable mode's state under root, under the lock.
func Load(root string) (*State, error) {
	var out *State
	err := (&diskStore{root: root, opts: Options{}.withDefaults()}).with(func(st *State) error {
		refreshReal(st)
		out = st.clone()
		return nil
	})
	return out, err
}

// Install makes binDir/<name> a symlink to exe (the multi-call binary)
// for every command the driver runs.
func Install(binDir, exe string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	for name := range freebsd.Commands {
		p := filepath.Join(binDir, name)
		_ = os.Remove(p)
		if err := os.Symlink(exe, p); err != nil {
			return err
		}
	}
	return nil
}

// State returns a deep copy of the whole state.
func (s *Sim) State() *State {
	var out *State
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		out = st.clone()
		return nil
	})
	return out
}

// Update runs fn on the live state under the lock (for tests that set
// up a host the commands cannot, e.g. a pool's mountpoint).
func (s *Sim) Update(fn func(*State) error) error { return s.st.with(fn) }

// FailNext makes the next command whose argv starts with prefix fail
// with that stderr and exit code, changing nothing.
func (s *Sim) FailNext(prefix []string, stderr string, code int) {
	_ = s.st.with(func(st *State) error {
		st.FailNext = append(st.FailNext, FailRule{Prefix: slices.Clone(prefix), Stderr: stderr, Code: code})
		return nil
	})
}

// SetSysctl sets a sysctl as a loader tunable or the administrator
// would (kern.racct.enable=0, net.inet.ip.forwarding=0, ...).
func (s *Sim) SetSysctl(name, value string) {
	_ = s.st.with(func(st *State) error {
		st.Sysctl[name] = value
		return nil
	})
}

// SetPF loads or unloads pf.ko.
func (s *Sim) SetPF(loaded bool) {
	_ = s.st.with(func(st *State) error {
		st.PF.Loaded = loaded
		return nil
	})
}

// IgnoreTerm makes the processes of that jail ignore SIGTERM (a workload
// with a TERM handler that never exits).
func (s *Sim) IgnoreTerm(jail string) {
	_ = s.st.with(func(st *State) error {
		if j := st.Jail(jail); j != nil {
			j.IgnoreTerm = true
		}
		return nil
	})
}

// Crash ends every process of the jail with that exit code, as if the
// workload died on its own.
func (s *Sim) Crash(jail string, code int) {
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		for i := range st.Procs {
			p := &st.Procs[i]
			if p.Jail != jail || p.Exited {
				continue
			}
			if p.Real {
				_ = syscall.Kill(p.Pid, syscall.SIGKILL)
				continue
			}
			s.endProc(p, code)
		}
		return nil
	})
}

// MakeBaseImage creates dataset (and its parents) holding a minimal
// FreeBSD base: /dev and the programs the driver runs inside a jail
// (/sbin/ifconfig, /sbin/route, docs/freebsd-notes.md §4.2), plus files.
func (s *Sim) MakeBaseImage(dataset string, files ...string) error {
	var out, errb bytes.Buffer
	if code := s.exec([]string{"zfs", "create", "-p", dataset}, "", &out, &errb); code != 0 {
		return fmt.Errorf("zfs create %s: %s", dataset, errb.String())
	}
	var mp string
	_ = s.st.with(func(st *State) error { mp = st.mountpoint(dataset); return nil })
	base := filepath.Join(s.root, mp)
	for _, d := range []string{"dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range append([]string{"/sbin/ifconfig", "/sbin/route", "/bin/sh", "/bin/sleep"}, files...) {
		p := filepath.Join(base, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Run implements freebsd.Runner.
func (s *Sim) Run(ctx context.Context, argv []string) (freebsd.Result, error) {
	if len(argv) == 0 {
		return freebsd.Result{}, errors.New("empty argv")
	}
	if _, ok := freebsd.Commands[argv[0]]; !ok {
		return freebsd.Result{}, fmt.Errorf("%q is not a command the freebsd driver runs", argv[0])
	}
	if err := ctx.Err(); err != nil {
		return freebsd.Result{}, err
	}
	var out, errb bytes.Buffer
	code := s.exec(argv, "", &out, &errb)
	return freebsd.Result{Stdout: out.Bytes(), Stderr: errb.Bytes(), Code: code}, nil
}

// call is one command invocation acting on the locked state.
type call struct {
	s    *Sim
	st   *State
	prog string
	// vnet is the jail whose VNET ifconfig and route act in ("" for the
	// host).
	vnet      string
	out, errb io.Writer
}

func (c *call) outf(format string, a ...any) { fmt.Fprintf(c.out, format, a...) }

func (c *call) path(p string) string { return filepath.Join(c.s.root, p) }

var handlers = map[string]func(*call, []string) int{
	"zfs":      cmdZFS,
	"jail":     cmdJail,
	"jls":      cmdJls,
	"mount":    cmdMount,
	"umount":   cmdUmount,
	"ifconfig": cmdIfconfig,
	"route":    cmdRoute,
	"rctl":     cmdRctl,
	"sysctl":   cmdSysctl,
	"pfctl":    cmdPfctl,
	"ps":       cmdPs,
	"kill":     cmdKill,
}

// exec runs one command in the VNET vnet and returns its exit status.
func (s *Sim) exec(argv []string, vnet string, out, errb io.Writer) int {
	name := argv[0]
	if code, ok := s.injected(argv, errb); ok {
		return code
	}
	switch {
	case name == "jail" && isJailRemove(argv[1:]):
		return s.jailRemove(argv, out, errb)
	case name == "jexec":
		return s.jexecRun(argv, out, errb)
	}
	h := handlers[name]
	if h == nil {
		fmt.Fprintf(errb, "%s: not a command the simulator models\n", name)
		return 127
	}
	code := 0
	err := s.st.with(func(st *State) error {
		s.refresh(st)
		code = h(&call{s: s, st: st, prog: name, vnet: vnet, out: out, errb: errb}, argv[1:])
		return nil
	})
	if err != nil {
		fmt.Fprintf(errb, "fbsdsim: %v\n", err)
		return 70
	}
	return code
}

func (s *Sim) injected(argv []string, errb io.Writer) (int, bool) {
	code, hit := 0, false
	_ = s.st.with(func(st *State) error {
		for i, r := range st.FailNext {
			if len(argv) >= len(r.Prefix) && slices.Equal(argv[:len(r.Prefix)], r.Prefix) {
				io.WriteString(errb, r.Stderr) //nolint:errcheck
				code, hit = r.Code, true
				st.FailNext = slices.Delete(st.FailNext, i, i+1)
				return nil
			}
		}
		return nil
	})
	return code, hit
}

// refresh brings the processes up to date: real ones from /proc,
// simulated ones are kept current as they end; dying jails with no
// process left disappear.
func (s *Sim) refresh(st *State) {
	refreshReal(st)
}

func refreshReal(st *State) {
	keep := st.Procs[:0]
	for _, p := range st.Procs {
		if p.Real {
			state, ticks, ok := procStat(p.Pid)
			if !ok || ticks != p.StartTicks {
				continue
			}
			p.Exited = state == 'Z'
		}
		keep = append(keep, p)
	}
	st.Procs = keep
	for k, j := range st.Jails {
		if !j.Dying {
			continue
		}
		alive := false
		for _, p := range st.Procs {
			if p.JID == j.JID {
				alive = true
			}
		}
		if !alive {
			delete(st.Jails, k)
		}
	}
}
