package freebsd

// The parsers of what FreeBSD's commands print. Each is a small function of
// the command's stdout, tested on captured output (testdata/) and fuzzed:
// none may panic, whatever it is given.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseJID reads `jls -j <name> jid`: the JID alone on a line
// (usr.sbin/jls/jls.c print_jail, one parameter, no header;
// docs/freebsd-notes.md §1.2). ok is false for empty or unreadable output,
// which the caller treats as "no jail".
func parseJID(out []byte) (jid int, ok bool) {
	s := strings.TrimSpace(string(out))
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// jailEntry is one line of `jls jid name`.
type jailEntry struct {
	JID  int
	Name string
}

// parseJails reads `jls jid name`: one line per jail, the two parameters
// separated by a space (usr.sbin/jls/jls.c print_jail: parameters given on
// the command line are printed with "{P: }" between them and no header).
// Lines that are not a JID and a name without spaces are skipped: they are
// jails Keel did not create (its names have no spaces).
func parseJails(out []byte) []jailEntry {
	var jails []jailEntry
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		jid, err := strconv.Atoi(f[0])
		if err != nil || jid <= 0 {
			continue
		}
		jails = append(jails, jailEntry{JID: jid, Name: f[1]})
	}
	return jails
}

// psEntry is one process of `ps -J <jid> -o pid= -o state= -o lstart=`.
type psEntry struct {
	PID   int
	State string
	// Start is the process's start time, to the second.
	Start time.Time
}

// zombie reports whether the process has exited and waits to be reaped:
// its state starts with Z (bin/ps/print.c state(); docs/freebsd-notes.md
// §1.5: zombies do not count as running).
func (p psEntry) zombie() bool { return strings.HasPrefix(p.State, "Z") }

// lstartLayout is lstart as ps prints it: strftime "%c" (bin/ps/print.c
// lstarted()) in the C locale, "%a %b %e %H:%M:%S %Y"; the driver's
// commands run with LC_ALL=C.
const lstartLayout = "Mon Jan _2 15:04:05 2006"

// parsePS reads `ps -J <jid> -o pid= -o state= -o lstart=`: one line per
// process, no header (every column's header is empty: bin/ps/ps.c
// printheader), the columns separated by spaces; lstart is five words.
// One -o per keyword: a keyword with "=" swallows the rest of its -o
// argument as its header (bin/ps/keyword.c parsefmt). Times are read in
// loc, the zone ps printed them in.
func parsePS(out []byte, loc *time.Location) ([]psEntry, error) {
	var procs []psEntry
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 7 {
			return nil, fmt.Errorf("ps: unexpected line %q (want pid, state and a start time)", strings.TrimSpace(line))
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("ps: unexpected pid in %q", strings.TrimSpace(line))
		}
		start, err := time.ParseInLocation(lstartLayout, strings.Join(f[2:], " "), loc)
		if err != nil {
			return nil, fmt.Errorf("ps: unexpected start time in %q (the driver expects the C locale)", strings.TrimSpace(line))
		}
		procs = append(procs, psEntry{PID: pid, State: f[1], Start: start})
	}
	return procs, nil
}

// mountEntry is one line of `mount -p`.
type mountEntry struct {
	Device, Point, FSType string
}

// parseMounts reads `mount -p`: device, mount point, type, options, dump
// and pass, separated by tabs used as padding (sbin/mount/mount.c
// putfsent): split on runs of white space (docs/freebsd-notes.md §3.3,
// §10.17). mount(8) does not escape white space in paths, so a path with a
// space cannot be told apart: the driver never mounts on such a path.
func parseMounts(out []byte) []mountEntry {
	var mounts []mountEntry
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mounts = append(mounts, mountEntry{Device: f[0], Point: f[1], FSType: f[2]})
	}
	return mounts
}

// parseZFSNames reads `zfs list -H -o name ...`: one name a line (-H: no
// header, tab-separated fields; sys/contrib/openzfs/cmd/zfs/zfs_main.c
// print_header/print_dataset; docs/freebsd-notes.md §2.8).
func parseZFSNames(out []byte) []string {
	var names []string
	for line := range strings.Lines(string(out)) {
		if s := strings.TrimSpace(line); s != "" && !strings.ContainsAny(s, " \t") {
			names = append(names, s)
		}
	}
	return names
}

// parseSysctlInt reads `sysctl -n <integer oid>`: the value alone on a line
// (sbin/sysctl/sysctl.c show_var with -n; docs/freebsd-notes.md §7).
func parseSysctlInt(out []byte) (int64, error) {
	s := strings.TrimSpace(string(out))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysctl printed %q, not an integer", s)
	}
	return n, nil
}

// parseBootTime reads `sysctl -n kern.boottime`, a struct timeval printed
// as "{ sec = 1700000000, usec = 123456 } Tue Nov 14 22:13:20 2023"
// (sbin/sysctl/sysctl.c S_timeval), and returns the seconds.
func parseBootTime(out []byte) (int64, error) {
	s := strings.TrimSpace(string(out))
	rest, ok := strings.CutPrefix(s, "{ sec = ")
	if !ok {
		return 0, fmt.Errorf("kern.boottime %q: not a timeval", s)
	}
	num, _, ok := strings.Cut(rest, ",")
	if !ok {
		return 0, fmt.Errorf("kern.boottime %q: not a timeval", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("kern.boottime %q: not a timeval", s)
	}
	return n, nil
}

// rctlRule is one rule as `rctl <filter>` prints it:
// subject:subject-id:resource:action=amount[/per] (usr.bin/rctl/rctl.c
// print_rules, one rule a line, amounts raw without -h;
// docs/freebsd-notes.md §5).
type rctlRule struct {
	Subject, ID, Resource, Action string
	Amount                        int64
	Per                           string
}

func (r rctlRule) String() string {
	s := fmt.Sprintf("%s:%s:%s:%s=%d", r.Subject, r.ID, r.Resource, r.Action, r.Amount)
	if r.Per != "" {
		s += "/" + r.Per
	}
	return s
}

var errRctlLine = errors.New("not an rctl rule")

// parseRctl reads the rules `rctl <filter>` prints.
func parseRctl(out []byte) ([]rctlRule, error) {
	var rules []rctlRule
	for line := range strings.Lines(string(out)) {
		s := strings.TrimSpace(line)
		if s == "" {
			continue
		}
		r, err := parseRctlRule(s)
		if err != nil {
			return nil, fmt.Errorf("rctl: %q: %w", s, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func parseRctlRule(s string) (rctlRule, error) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) != 4 {
		return rctlRule{}, errRctlLine
	}
	action, amount, ok := strings.Cut(parts[3], "=")
	if !ok || action == "" {
		return rctlRule{}, errRctlLine
	}
	amount, per, _ := strings.Cut(amount, "/")
	n, err := strconv.ParseInt(amount, 10, 64)
	if err != nil || n < 0 {
		return rctlRule{}, errRctlLine
	}
	return rctlRule{Subject: parts[0], ID: parts[1], Resource: parts[2], Action: action, Amount: n, Per: per}, nil
}

// parseZFSGet reads `zfs get -H -o name,property,value ...`: one property
// a line, the columns separated by tabs, the value last and printed as it
// is (lib/libzfs/libzfs_util.c zprop_print_one_property with -H). It
// returns the values by object, then by property; a line without three
// columns is skipped.
func parseZFSGet(out []byte) map[string]map[string]string {
	objs := map[string]map[string]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), "\t", 3)
		if len(f) != 3 || f[0] == "" || f[1] == "" {
			continue
		}
		if objs[f[0]] == nil {
			objs[f[0]] = map[string]string{}
		}
		objs[f[0]][f[1]] = f[2]
	}
	return objs
}

// parseDependents reads the datasets zfs destroy lists after "use '-R' to
// destroy the following datasets:" (or "use '-r' ..."), one a line, when it
// refuses (sys/contrib/openzfs/cmd/zfs/zfs_main.c
// destroy_check_dependent).
func parseDependents(stderr string) []string {
	var out []string
	listing := false
	for line := range strings.Lines(stderr) {
		s := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(s, "use '-"):
			listing = strings.HasSuffix(s, "the following datasets:")
		case strings.HasPrefix(s, "cannot "):
			listing = false
		case listing && s != "" && !strings.ContainsAny(s, " \t"):
			out = append(out, s)
		}
	}
	return out
}
