package fbsdsim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keel-dev/keel/nodeexec/freebsd"
)

// simProc is a process of the in-process mode: it runs until a signal,
// jail -r or Crash ends it.
type simProc struct {
	s    *Sim
	pid  int
	done chan struct{}
	code int
}

func (p *simProc) Pid() int { return p.pid }

// Wait blocks until the process ends, then reaps it: until then ps shows
// it as a zombie and it holds its jail's root busy
// (docs/freebsd-notes.md §1.7 step 4).
func (p *simProc) Wait() (int, error) {
	<-p.done
	_ = p.s.st.with(func(st *State) error {
		for i, q := range st.Procs {
			if q.Pid == p.pid && !q.Real {
				st.Procs = append(st.Procs[:i], st.Procs[i+1:]...)
				break
			}
		}
		p.s.refresh(st)
		return nil
	})
	p.s.mu.Lock()
	delete(p.s.procs, p.pid)
	p.s.mu.Unlock()
	return p.code, nil
}

// endProc ends a simulated process (under the state lock): code -1 for
// a signal, as freebsd.Proc.Wait reports it.
func (s *Sim) endProc(p *Proc, code int) {
	if p.Exited || p.Real {
		return
	}
	p.Exited, p.Code = true, code
	s.mu.Lock()
	sp := s.procs[p.Pid]
	s.mu.Unlock()
	if sp != nil {
		sp.code = code
		close(sp.done)
	}
}

// Start implements freebsd.Runner for ["jexec", jail, cmd...]: it starts
// a simulated process in the jail. As jexec(8) does (usr.sbin/jexec/
// jexec.c main), it fails with exit 1 when the jail does not exist
// (jail_getid: `jail "<name>" not found`) or the command cannot be
// exec'd inside the jail's root (err(1, "execvp: %s")); the failure is
// written to stderr and the process ends at once.
func (s *Sim) Start(argv []string, stdout, stderr *os.File) (freebsd.Proc, error) {
	if s.disk {
		return nil, errors.New("fbsdsim: the executable mode starts processes through the jexec executable")
	}
	if len(argv) == 0 || argv[0] != "jexec" {
		return nil, fmt.Errorf("fbsdsim: Start runs jexec only, not %q", argv)
	}
	if code, ok := s.injected(argv, stderr); ok {
		return s.finished(code), nil
	}
	jname, cmd, msg, code := jexecArgs(argv)
	if code != 0 {
		io.WriteString(stderr, msg) //nolint:errcheck
		return s.finished(code), nil
	}
	var sp *simProc
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		j := lookupJail(st, jname)
		if j == nil {
			msg = fmt.Sprintf("jexec: jail \"%s\" not found\n", jname)
			return nil
		}
		if !s.inJailPath(j, cmd[0]) {
			msg = execvpMsg(cmd[0])
			return nil
		}
		st.LastPid++
		pid := 40000 + st.LastPid
		st.Procs = append(st.Procs, Proc{Pid: pid, JID: j.JID, Jail: j.Name, Argv: append([]string(nil), cmd...), Start: time.Now()})
		sp = &simProc{s: s, pid: pid, done: make(chan struct{})}
		s.mu.Lock()
		s.procs[pid] = sp
		s.mu.Unlock()
		return nil
	})
	if sp == nil {
		io.WriteString(stderr, msg) //nolint:errcheck
		return s.finished(1), nil
	}
	return sp, nil
}

func (s *Sim) finished(code int) *simProc {
	p := &simProc{s: s, pid: 0, done: make(chan struct{}), code: code}
	close(p.done)
	return p
}

// inJailPath reports whether cmd resolves to a file inside the jail's
// root, as execvp would look it up after jail_attach (PATH
// /sbin:/bin:/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin for a
// bare name).
func (s *Sim) inJailPath(j *Jail, cmd string) bool {
	try := []string{cmd}
	if !strings.Contains(cmd, "/") {
		try = nil
		for _, d := range []string{"/sbin", "/bin", "/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"} {
			try = append(try, d+"/"+cmd)
		}
	}
	for _, c := range try {
		if fi, err := os.Stat(filepath.Join(s.root, j.Path, c)); err == nil && !fi.IsDir() {
			return true
		}
	}
	return false
}

// jexecUsage is usage() in usr.sbin/jexec/jexec.c (FreeBSD 12 to 14).
const jexecUsage = "usage: jexec [-l] [-u username | -U username] jail [command ...]\n"

// jexecArgs parses jexec's argv as usr.sbin/jexec/jexec.c main does:
// getopt "lnu:U:", usage (exit 1) without a jail or with both -u and -U.
// A jail without a command runs the user's shell, which is not
// modelled. It returns the jail and the command, or the message and the
// exit status.
func jexecArgs(argv []string) (jail string, cmd []string, msg string, code int) {
	r := getopt("jexec", argv[1:], "lnu:U:")
	u, U := false, false
	for _, o := range r.opts {
		u = u || o.c == 'u'
		U = U || o.c == 'U'
	}
	switch {
	case r.bad != 0 || len(r.rest) < 1 || (u && U):
		return "", nil, r.msg + jexecUsage, 1
	case len(r.rest) == 1:
		return "", nil, "fbsdsim: jexec without a command (the jail's shell) is not modelled\n", 1
	}
	return r.rest[0], r.rest[1:], "", 0
}

// execvpMsg is jexec's err(1, "execvp: %s", argv[1]) when the command
// is not found inside the jail.
func execvpMsg(cmd string) string {
	return fmt.Sprintf("jexec: execvp: %s: No such file or directory\n", cmd)
}

// lookupJail finds a live jail by name or jid, as jail_getid(3) does.
func lookupJail(st *State, nameOrJID string) *Jail {
	if n, err := strconv.Atoi(nameOrJID); err == nil && n > 0 {
		for _, j := range st.Jails {
			if j.JID == n && !j.Dying {
				return j
			}
		}
		return nil
	}
	return st.Jail(nameOrJID)
}

// jexecRun handles jexec through Runner.Run (and the jexec executable
// for the commands it models): /sbin/ifconfig and /sbin/route run inside
// the jail's VNET; anything else is not modelled.
func (s *Sim) jexecRun(argv []string, out, errb io.Writer) int {
	jname, args, msg, code := jexecArgs(argv)
	if code != 0 {
		io.WriteString(errb, msg) //nolint:errcheck
		return code
	}
	cmd := args[0]
	var vnet string
	code = -1
	_ = s.st.with(func(st *State) error {
		j := lookupJail(st, jname)
		switch {
		case j == nil:
			fmt.Fprintf(errb, "jexec: jail \"%s\" not found\n", jname)
			code = 1
		case !s.inJailPath(j, cmd):
			// usr.sbin/jexec/jexec.c: err(1, "execvp: %s", argv[1]); a
			// base image without /sbin/route fails here
			// (docs/freebsd-notes.md §4.2, §10.21).
			io.WriteString(errb, execvpMsg(cmd)) //nolint:errcheck
			code = 1
		case !j.VNet:
			// A non-VNET jail shares the host's stack; ifconfig and route
			// would act on the host's.
			vnet = ""
		default:
			vnet = j.Name
		}
		return nil
	})
	if code >= 0 {
		return code
	}
	switch filepath.Base(cmd) {
	case "ifconfig", "route":
		inner := append([]string{filepath.Base(cmd)}, args[1:]...)
		return s.execIn(inner, vnet, out, errb)
	}
	fmt.Fprintf(errb, "fbsdsim: jexec %s %s: running that command is not modelled\n", jname, cmd)
	return 1
}

func (s *Sim) execIn(argv []string, vnet string, out, errb io.Writer) int {
	code := 0
	err := s.st.with(func(st *State) error {
		s.refresh(st)
		code = handlers[argv[0]](&call{s: s, st: st, prog: argv[0], vnet: vnet, out: out, errb: errb}, argv[1:])
		return nil
	})
	if err != nil {
		fmt.Fprintf(errb, "fbsdsim: %v\n", err)
		return 70
	}
	return code
}

// signalProc delivers sig to a recorded process (under the lock).
func (s *Sim) signalProc(st *State, p *Proc, sig syscall.Signal) error {
	if p.Exited {
		return nil
	}
	if p.Real {
		return syscall.Kill(p.Pid, sig)
	}
	if sig == syscall.SIGTERM {
		if j := lookupJailAny(st, p.JID); j != nil && j.IgnoreTerm {
			return nil
		}
	}
	if sig == 0 {
		return nil
	}
	s.endProc(p, -1)
	return nil
}

// lookupDying reports whether a dying jail has that name or jid.
func lookupDying(st *State, nameOrJID string) bool {
	n, _ := strconv.Atoi(nameOrJID)
	for _, j := range st.Jails {
		if j.Dying && (j.Name == nameOrJID || j.JID == n) {
			return true
		}
	}
	return false
}

func lookupJailAny(st *State, jid int) *Jail {
	for _, j := range st.Jails {
		if j.JID == jid {
			return j
		}
	}
	return nil
}

func isJailRemove(args []string) bool {
	r := getopt("jail", args, jailOpts)
	stop := false
	for _, o := range r.opts {
		switch o.c {
		case 'r', 'R':
			stop = true
		case 'c', 'm', 'e':
			// -cr and -mr restart a jail, -e shows: cmdJail says they are
			// not modelled.
			return false
		}
	}
	return stop && r.bad == 0
}

// jailRemove is `jail -r name`. jail(8) runs its stop commands
// (usr.sbin/jail/jail.c main, command.c): term_procs sends SIGTERM to
// every process of the jail and waits up to stop.timeout (10 s), then
// jail_remove(2) kills what is left. A name that is no running jail is
// `jail: "<name>" not found` (state.c start_state), exit 1. The mounts
// made by mount.devfs at creation are NOT unmounted: a command-line jail
// -r does not know them (docs/freebsd-notes.md §1.7 step 3). The epairs
// moved into a VNET jail return to the host (§4.5); the jail's lo0 and
// routes go with its VNET. Processes killed stay zombies until reaped,
// and until then the dying jail still holds its root busy. There is no
// /etc/jail.conf, so jail.c main's note_remove is set only by several
// jails: then each removed jail is noted "<name>: removed" on stdout
// (command.c run_command IP__OP).
func (s *Sim) jailRemove(argv []string, out, errb io.Writer) int {
	r := getopt("jail", argv[1:], jailOpts)
	docf, rflag := true, false
	for _, o := range r.opts {
		switch o.c {
		case 'h', 'l', 'n', 's', 'u', 'U':
			docf = false
		case 'R':
			rflag = true
		}
	}
	if !docf || len(r.rest) == 0 {
		io.WriteString(errb, jailUsage) //nolint:errcheck
		return 1
	}
	for _, a := range r.rest {
		if strings.Contains(a, "=") && !rflag {
			io.WriteString(errb, jailUsage) //nolint:errcheck
			return 1
		}
		if rflag || strings.ContainsAny(a, "*") {
			fmt.Fprintf(errb, "fbsdsim: jail -R and wildcard jail names are not modelled\n")
			return 1
		}
	}
	status := 0
	for _, name := range r.rest {
		if s.removeOne(name, errb) != 0 {
			status = 1
		} else if len(r.rest) > 1 {
			fmt.Fprintf(out, "%s: removed\n", name)
		}
	}
	return status
}

func (s *Sim) removeOne(name string, errb io.Writer) int {
	var pending []int
	var jid int
	found, dying := false, false
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		j := lookupJail(st, name)
		if j == nil {
			dying = lookupDying(st, name)
			return nil
		}
		found, jid = true, j.JID
		for i := range st.Procs {
			p := &st.Procs[i]
			if p.JID == jid && !p.Exited {
				_ = s.signalProc(st, p, syscall.SIGTERM)
				pending = append(pending, p.Pid)
			}
		}
		return nil
	})
	if dying {
		// usr.sbin/jail/state.c start_state finds a dying jail for -r
		// (running_jid with JAIL_DYING) and jail_remove(2) of it succeeds
		// without a word (sys/kern/kern_jail.c sys_jail_remove: "Silently
		// ignore already-dying prisons").
		return 0
	}
	if !found {
		fmt.Fprintf(errb, "jail: \"%s\" not found\n", name)
		return 1
	}
	deadline := time.Now().Add(s.opts.StopTimeout)
	for len(pending) > 0 && time.Now().Before(deadline) {
		pending = s.stillRunning(jid)
		if len(pending) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		for i := range st.Procs {
			p := &st.Procs[i]
			if p.JID == jid && !p.Exited {
				_ = s.signalProc(st, p, syscall.SIGKILL)
			}
		}
		return nil
	})
	// A SIGKILLed real process needs a moment to become a zombie.
	for end := time.Now().Add(5 * time.Second); len(s.stillRunning(jid)) > 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		j := lookupJailAny(st, jid)
		if j == nil {
			return nil
		}
		delete(st.Jails, j.Name)
		for _, p := range st.Procs {
			if p.JID == jid {
				j.Dying = true
				st.Jails[fmt.Sprintf("%s#dying#%d", j.Name, j.JID)] = j
				break
			}
		}
		destroyVNet(st, j.Name)
		return nil
	})
	return 0
}

func (s *Sim) stillRunning(jid int) []int {
	var pids []int
	_ = s.st.with(func(st *State) error {
		s.refresh(st)
		for _, p := range st.Procs {
			if p.JID == jid && !p.Exited {
				pids = append(pids, p.Pid)
			}
		}
		return nil
	})
	return pids
}

// destroyVNet tears down a VNET jail's network stack: interfaces moved in
// go back to the host (if_vmove back to their home vnet), its loopback
// and routes vanish.
func destroyVNet(st *State, jail string) {
	keep := st.Ifaces[:0]
	for _, i := range st.Ifaces {
		if i.VNet != jail {
			keep = append(keep, i)
			continue
		}
		if i.Kind == "loopback" {
			continue
		}
		i.VNet, i.Addrs, i.Up = "", nil, false
		keep = append(keep, i)
	}
	st.Ifaces = keep
	rk := st.Routes[:0]
	for _, r := range st.Routes {
		if r.VNet != jail {
			rk = append(rk, r)
		}
	}
	st.Routes = rk
}

// procStat reads /proc/<pid>/stat: the state letter and the start time
// in clock ticks (field 22).
func procStat(pid int) (byte, uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, false
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], ticks, true
}

// JexecMain is the jexec executable: jexec(8) (usr.sbin/jexec/jexec.c)
// attaches to the jail and execs the command. The simulator records its
// own pid as a process of the jail, then execs the command when it
// resolves on this host (an absolute path that exists, or a name found
// in PATH), else blocks until a signal ends it; env(1), which the drivers
// put first, runs as envRun models it. It never holds the state lock
// while it runs. /sbin/ifconfig and /sbin/route run in the jail's
// VNET as the simulator's own commands.
func (s *Sim) JexecMain(argv []string, stdout, stderr io.Writer) int {
	jname, args, msg, code := jexecArgs(argv)
	if code != 0 {
		io.WriteString(stderr, msg) //nolint:errcheck
		return code
	}
	switch filepath.Base(args[0]) {
	case "ifconfig", "route":
		return s.exec(argv, "", stdout, stderr)
	}
	if code, ok := s.injected(argv, stderr); ok {
		return code
	}
	_, ticks, ok := procStat(os.Getpid())
	if !ok {
		fmt.Fprintln(stderr, "fbsdsim: cannot read /proc/self/stat")
		return 70
	}
	ignoreTerm := false
	err := s.st.with(func(st *State) error {
		refreshReal(st)
		j := lookupJail(st, jname)
		if j == nil {
			msg = fmt.Sprintf("jexec: jail \"%s\" not found\n", jname)
			return nil
		}
		ignoreTerm = j.IgnoreTerm
		st.Procs = append(st.Procs, Proc{Pid: os.Getpid(), JID: j.JID, Jail: j.Name, Argv: append([]string(nil), args...),
			Start: time.Now(), StartTicks: ticks, Real: true})
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "fbsdsim: %v\n", err)
		return 70
	}
	if msg != "" {
		io.WriteString(stderr, msg) //nolint:errcheck
		return 1
	}
	if ignoreTerm {
		// An ignored disposition survives exec(2), as on FreeBSD.
		// signal.Ignore sets SIG_IGN in the kernel for SIGTERM.
		signal.Ignore(syscall.SIGTERM)
	}
	cmd := args[0]
	if filepath.Base(cmd) == "env" {
		path, argv, env, msg, code := envRun(args, os.Environ())
		if code != 0 {
			io.WriteString(stderr, msg) //nolint:errcheck
			return code
		}
		err = syscall.Exec(path, argv, env)
		fmt.Fprintf(stderr, "env: %s: %v\n", argv[0], err)
		return 126
	}
	if p, err := exec.LookPath(cmd); err == nil {
		err = syscall.Exec(p, args, os.Environ())
		fmt.Fprintf(stderr, "jexec: execvp: %s: %v\n", cmd, err)
		return 1
	}
	for {
		time.Sleep(time.Hour)
	}
}
