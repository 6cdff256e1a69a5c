package fbsdsim

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const rctlUsage = "usage: rctl [ -h ] [-a rule | -l filter | -r filter | -u filter | filter]\n"

var rctlResources = map[string]bool{
	"cputime": true, "datasize": true, "stacksize": true, "coredumpsize": true,
	"memoryuse": true, "memorylocked": true, "maxproc": true, "openfiles": true,
	"vmemoryuse": true, "pseudoterminals": true, "swapuse": true, "nthr": true,
	"msgqqueued": true, "msgqsize": true, "nmsgq": true, "nsem": true,
	"nsemop": true, "nshm": true, "shmsize": true, "wallclock": true,
	"pcpu": true, "readbps": true, "writebps": true, "readiops": true, "writeiops": true,
}

// cmdRctl is rctl(8) (usr.bin/rctl/rctl.c main: getopt "ahlnru"; usage
// exit 1; add_rule warn "failed to add rule '%s'", remove_rule warn
// "failed to remove rule '%s'" (ESRCH "No such process" when nothing
// matched, docs/freebsd-notes.md §5); enosys() when kern.racct.enable is
// 0: "RACCT/RCTL present, but disabled; enable using kern.racct.enable=1
// tunable"). Rules are kept as the kernel prints them, amounts expanded
// (expand_rule: 512M → 536870912); a rule with the same subject,
// resource and action replaces the old one.
func cmdRctl(c *call, args []string) int {
	r := getopt("rctl", args, "ahlnru")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+rctlUsage)
		return 1
	}
	mode := byte(0)
	n := 0
	for _, o := range r.opts {
		switch o.c {
		case 'a', 'l', 'r', 'u':
			mode = o.c
			n++
		}
	}
	if n > 1 {
		fmt.Fprintf(c.errb, "rctl: at most one of -a, -l, -r, or -u may be specified\n")
		return 1
	}
	if len(r.rest) == 0 && mode != 0 {
		fmt.Fprint(c.errb, rctlUsage)
		return 1
	}
	enosys := func() bool {
		if c.st.Sysctl["kern.racct.enable"] == "0" {
			fmt.Fprintf(c.errb, "rctl: RACCT/RCTL present, but disabled; enable using kern.racct.enable=1 tunable\n")
			return true
		}
		return false
	}
	if len(r.rest) == 0 {
		if enosys() {
			return 1
		}
		for _, rule := range c.st.Rctl {
			c.outf("%s\n", rule)
		}
		return 0
	}
	errs := 0
	for _, arg := range r.rest {
		if enosys() {
			return 1
		}
		switch mode {
		case 'a':
			rule, ok := parseRule(arg)
			if !ok {
				fmt.Fprintf(c.errb, "rctl: failed to add rule '%s': Invalid argument\n", arg)
				errs++
				continue
			}
			f := strings.SplitN(rule, ":", 4)
			act, _, _ := strings.Cut(f[3], "=")
			replaced := false
			for k, old := range c.st.Rctl {
				g := strings.SplitN(old, ":", 4)
				oact, _, _ := strings.Cut(g[3], "=")
				if g[0] == f[0] && g[1] == f[1] && g[2] == f[2] && oact == act {
					c.st.Rctl[k], replaced = rule, true
				}
			}
			if !replaced {
				c.st.Rctl = append(c.st.Rctl, rule)
			}
		case 'r':
			keep := c.st.Rctl[:0]
			removed := 0
			for _, old := range c.st.Rctl {
				if ruleMatches(old, arg) {
					removed++
					continue
				}
				keep = append(keep, old)
			}
			c.st.Rctl = keep
			if removed == 0 {
				fmt.Fprintf(c.errb, "rctl: failed to remove rule '%s': No such process\n", arg)
				errs++
			}
		case 0, 'l':
			for _, old := range c.st.Rctl {
				if ruleMatches(old, arg) {
					c.outf("%s\n", old)
				}
			}
		case 'u':
			fmt.Fprintf(c.errb, "fbsdsim: rctl -u is not modelled\n")
			errs++
		}
	}
	return errs
}

// parseRule checks and expands subject:subject-id:resource:action=amount
// as rctl's expand_rule and the kernel's rctl_string_to_rule do.
func parseRule(s string) (string, bool) {
	f := strings.SplitN(s, ":", 4)
	if len(f) != 4 {
		return "", false
	}
	switch f[0] {
	case "jail", "j", "process", "p", "user", "u", "loginclass", "lc":
	default:
		return "", false
	}
	if f[0] == "j" {
		f[0] = "jail"
	}
	if f[1] == "" || !rctlResources[f[2]] {
		return "", false
	}
	act, amt, ok := strings.Cut(f[3], "=")
	switch act {
	case "deny", "log", "devctl", "throttle", "sigterm", "sigkill", "sighup", "sigint", "sigstop":
	default:
		return "", false
	}
	if !ok {
		return "", false
	}
	per := ""
	if a, p, has := strings.Cut(amt, "/"); has {
		amt, per = a, "/"+p
	}
	n, ok := parseSize(amt)
	if !ok || amt == "none" {
		return "", false
	}
	return fmt.Sprintf("%s:%s:%s:%s=%d%s", f[0], f[1], f[2], act, n, per), true
}

// ruleMatches applies a filter (subject[:id[:resource[:action]]]).
func ruleMatches(rule, filter string) bool {
	rf := strings.SplitN(rule, ":", 4)
	ff := strings.SplitN(filter, ":", 4)
	if len(ff) > 0 && ff[0] == "j" {
		ff[0] = "jail"
	}
	for i, x := range ff {
		if x == "" {
			continue
		}
		if i == 3 {
			a, _, _ := strings.Cut(rf[3], "=")
			fa, _, _ := strings.Cut(x, "=")
			if a != fa {
				return false
			}
			continue
		}
		if i >= len(rf) || rf[i] != x {
			return false
		}
	}
	return true
}

const sysctlUsage = "usage: sysctl [-bdehiNnoqTtWx] [ -B <bufsize> ] [-f filename] name[=value] ...\n" +
	"       sysctl [-bdehNnoqTtWx] [ -B <bufsize> ] -a\n"

// sysctlWritable are the modelled oids sysctl(8) may set at run time;
// the others are read-only or loader tunables (kern.racct.enable).
var sysctlWritable = map[string]bool{"net.inet.ip.forwarding": true, "kern.hostname": true}

// cmdSysctl is sysctl(8) (sbin/sysctl/sysctl.c main/parse/show_var: an
// unknown name warns "unknown oid '%s'" and the exit status counts the
// failures; -n prints the value alone).
func cmdSysctl(c *call, args []string) int {
	r := getopt("sysctl", args, "AabB:def:hiNnoqtTwWxX")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+sysctlUsage)
		return 1
	}
	nflag, all, quiet, ignore := false, false, false, false
	for _, o := range r.opts {
		switch o.c {
		case 'n':
			nflag = true
		case 'a', 'A', 'o', 'X':
			all = true
		case 'q':
			quiet = true
		case 'i':
			ignore = true
		}
	}
	if all {
		for _, k := range sortedKeys(c.st.Sysctl) {
			c.printOID(k, nflag)
		}
		return 0
	}
	if len(r.rest) == 0 {
		fmt.Fprint(c.errb, sysctlUsage)
		return 1
	}
	warns := 0
	for _, a := range r.rest {
		name, val, set := strings.Cut(a, "=")
		v, ok := c.st.Sysctl[name]
		if !ok {
			if ignore {
				continue
			}
			if !quiet {
				fmt.Fprintf(c.errb, "sysctl: unknown oid '%s'\n", name)
			}
			warns++
			continue
		}
		if !set {
			c.printOID(name, nflag)
			continue
		}
		if !sysctlWritable[name] {
			if name == "kern.racct.enable" {
				fmt.Fprintf(c.errb, "sysctl: oid '%s' is a read only tunable\nsysctl: Tunable values are set in /boot/loader.conf\n", name)
			} else {
				fmt.Fprintf(c.errb, "sysctl: oid '%s' is read only\n", name)
			}
			warns++
			continue
		}
		c.st.Sysctl[name] = val
		if nflag {
			c.outf("%s\n", val)
		} else {
			c.outf("%s: %s -> %s\n", name, v, val)
		}
	}
	// sysctl.c main: the exit status is warncount.
	return warns
}

func (c *call) printOID(k string, nflag bool) {
	if nflag {
		c.outf("%s\n", c.st.Sysctl[k])
	} else {
		c.outf("%s: %s\n", k, c.st.Sysctl[k])
	}
}

// pfctlUsage is usage() in sbin/pfctl/pfctl.c (FreeBSD 14; a newer
// main lists -S as well, see MODEL.md).
const pfctlUsage = "usage: pfctl [-AdeghMmNnOPqRrvz] [-a anchor] [-D macro=value] [-F modifier]\n" +
	"\t[-f file] [-i interface] [-K host | network]\n" +
	"\t[-k host | network | gateway | label | id] [-o level] [-p device]\n" +
	"\t[-s modifier] [-t table -T command [address ...]] [-x level]\n"

// pfctl.c clearopt_list and showopt_list: -F and -s take any prefix of
// these, the first that matches (pfctl_lookup_option).
var (
	pfClearOpts = []string{"nat", "queue", "rules", "Sources", "states", "info", "Tables", "osfp", "all", "ethernet", "Reset"}
	pfShowOpts  = []string{"ether", "nat", "queue", "rules", "Anchors", "Sources", "states", "info", "Interfaces", "labels", "timeouts", "memory", "Tables", "osfp", "Running", "all", "creatorids"}
)

func pfLookup(arg string, list []string) string {
	if arg == "" {
		return ""
	}
	for _, o := range list {
		if strings.HasPrefix(o, arg) {
			return o
		}
	}
	return ""
}

// cmdPfctl is pfctl(8) (sbin/pfctl/pfctl.c main): the options are
// checked first (an unknown -s or -F modifier and an extra argument are a
// warning and the usage, exit 1), then /dev/pf is opened (without pf.ko:
// err(1, "%s", pf_device)), then -d, -s, -F, -f and -e run in that order.
// -s nat|rules|Anchors|info and -F nat|rules are modelled. The rules file
// is read under the simulator's root and may only hold comments, blank
// lines, `rdr [pass] on <if> inet proto tcp from any to <dst> port <n> ->
// <addr> port <n>`, `pass ...` and anchor calls (`rdr-anchor "<name>"`,
// `anchor "<name>"`); anything else is "<file>:<line>: syntax error" and
// "Syntax error in config file: pf rules not loaded" (sbin/pfctl/parse.y
// yyerror, pfctl.c pfctl_rules). A file replaces the whole ruleset of its
// anchor. Rules print as loaded, anchor calls as pfctl_parser.c
// print_rule does (`rdr-anchor "keel" all`).
func cmdPfctl(c *call, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.errb, pfctlUsage)
		return 1
	}
	r := getopt("pfctl", args, "a:AdD:eqf:F:ghi:k:K:mMnNOo:Pp:rRs:St:T:vx:z")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+pfctlUsage)
		return 1
	}
	anchor, file, show, flush := "", "", "", ""
	hasAnchor, quiet, noaction, enable, disable, write := false, false, false, false, false, false
	for _, o := range r.opts {
		switch o.c {
		case 'a':
			anchor, hasAnchor = o.arg, true
		case 'f':
			file, write = o.arg, true
		case 's':
			if show = pfLookup(o.arg, pfShowOpts); show == "" {
				fmt.Fprintf(c.errb, "pfctl: Unknown show modifier '%s'\n%s", o.arg, pfctlUsage)
				return 1
			}
		case 'F':
			if flush = pfLookup(o.arg, pfClearOpts); flush == "" {
				fmt.Fprintf(c.errb, "pfctl: Unknown flush modifier '%s'\n%s", o.arg, pfctlUsage)
				return 1
			}
			write = true
		case 'q':
			quiet = true
		case 'n':
			noaction = true
		case 'e':
			enable, write = true, true
		case 'd':
			disable, write = true, true
		case 'v':
		default:
			fmt.Fprintf(c.errb, "fbsdsim: pfctl -%c is not modelled\n", o.c)
			return 1
		}
	}
	if len(r.rest) > 0 {
		fmt.Fprintf(c.errb, "pfctl: unknown command line argument: %s ...\n%s", r.rest[0], pfctlUsage)
		return 1
	}
	if hasAnchor {
		switch {
		case anchor == "":
			fmt.Fprintf(c.errb, "pfctl: anchor name must not be empty\n")
			return 1
		case !write && show == "":
			fmt.Fprintf(c.errb, "pfctl: anchors apply to -f, -F, -s, and -T only\n%s", pfctlUsage)
			return 1
		case write && (anchor[0] == '_' || strings.Contains(anchor, "/_")):
			fmt.Fprintf(c.errb, "pfctl: anchor names beginning with '_' cannot be modified from the command line\n")
			return 1
		case strings.HasSuffix(anchor, "*"):
			fmt.Fprintf(c.errb, "fbsdsim: pfctl -a %s (recursion) is not modelled\n", anchor)
			return 1
		}
	}
	if !c.st.PF.Loaded {
		fmt.Fprintf(c.errb, "pfctl: /dev/pf: No such file or directory\n")
		return 1
	}
	if noaction {
		// main: -n turns off -s, -F, -e and -d; the rules are parsed only.
		show, flush, enable, disable = "", "", false, false
	}
	note := func(msg string) {
		if !quiet {
			fmt.Fprint(c.errb, msg)
		}
	}
	if disable {
		// pfctl_disable.
		if c.st.PF.Disabled {
			fmt.Fprintf(c.errb, "pfctl: pf not enabled\n")
			return 1
		}
		c.st.PF.Disabled, c.st.PF.Since = true, time.Now()
		note("pf disabled\n")
	}
	rules := c.st.PF.Anchors[anchor]
	switch show {
	case "":
	case "nat":
		for _, l := range rules {
			if pfNATRule(l) {
				c.outf("%s\n", pfPrint(l))
			}
		}
	case "rules":
		for _, l := range rules {
			if !pfNATRule(l) {
				c.outf("%s\n", pfPrint(l))
			}
		}
	case "Anchors":
		// pfctl_show_anchors: the anchors below the given one.
		for _, a := range c.st.pfAnchors() {
			if anchor == "" && !strings.Contains(a, "/") {
				c.outf("  %s\n", a)
			} else if rest, ok := strings.CutPrefix(a, anchor+"/"); ok && anchor != "" && !strings.Contains(rest, "/") {
				c.outf("  %s\n", a)
			}
		}
	case "info":
		c.pfStatus()
	default:
		fmt.Fprintf(c.errb, "fbsdsim: pfctl -s %s is not modelled\n", show)
		return 1
	}
	switch flush {
	case "":
	case "nat":
		// pfctl_flush_nat.
		c.st.PF.setRules(anchor, pfKeep(rules, false))
		note("nat cleared\n")
	case "rules":
		// pfctl_flush_rules.
		c.st.PF.setRules(anchor, pfKeep(rules, true))
		note("rules cleared\n")
	default:
		fmt.Fprintf(c.errb, "fbsdsim: pfctl -F %s is not modelled\n", flush)
		return 1
	}
	if file != "" {
		b, err := os.ReadFile(c.path(file))
		if err != nil {
			fmt.Fprintf(c.errb, "pfctl: %s: No such file or directory\npfctl: cannot open the main config file!: No such file or directory\npfctl: Syntax error in config file: pf rules not loaded\n", file)
			return 1
		}
		var loaded []string
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = strings.TrimSpace(line[:i])
			}
			if line == "" {
				continue
			}
			if !pfLineOK(line) {
				fmt.Fprintf(c.errb, "%s:%d: syntax error\npfctl: Syntax error in config file: pf rules not loaded\n", file, n+1)
				return 1
			}
			loaded = append(loaded, strings.Join(strings.Fields(line), " "))
		}
		if !noaction {
			c.st.PF.setRules(anchor, loaded)
		}
	}
	if enable {
		// pfctl_enable.
		if !c.st.PF.Disabled {
			fmt.Fprintf(c.errb, "pfctl: pf already enabled\n")
			return 1
		}
		c.st.PF.Disabled, c.st.PF.Since = false, time.Now()
		note("pf enabled\n")
	}
	return 0
}

func (p *PF) setRules(anchor string, rules []string) {
	if len(rules) == 0 {
		delete(p.Anchors, anchor)
		return
	}
	p.Anchors[anchor] = rules
}

// pfAnchors are the anchors that exist: loaded ones and those an anchor
// call names (the kernel creates an anchor for both).
func (s *State) pfAnchors() []string {
	set := map[string]bool{}
	for a, rules := range s.PF.Anchors {
		if a != "" {
			set[a] = true
		}
		for _, l := range rules {
			if name, ok := pfAnchorCall(l); ok {
				if a != "" {
					name = a + "/" + name
				}
				set[name] = true
			}
		}
	}
	return sortedKeys(set)
}

// pfNATRule reports whether a rule lives in the nat section (pfctl -s nat)
// rather than the filter one.
func pfNATRule(l string) bool {
	f := strings.Fields(l)[0]
	return f == "rdr" || f == "nat" || f == "binat" || f == "rdr-anchor" || f == "nat-anchor" || f == "binat-anchor"
}

// pfKeep keeps the rules of one section: the filter ones or the nat ones.
func pfKeep(rules []string, nat bool) []string {
	var out []string
	for _, l := range rules {
		if pfNATRule(l) == nat {
			out = append(out, l)
		}
	}
	return out
}

// pfAnchorCall parses `[rdr-|nat-]anchor "name"` (or the name unquoted).
func pfAnchorCall(l string) (string, bool) {
	f := strings.Fields(l)
	if len(f) != 2 || (f[0] != "anchor" && f[0] != "rdr-anchor" && f[0] != "nat-anchor") {
		return "", false
	}
	name := strings.Trim(f[1], `"`)
	if name == "" || strings.ContainsAny(name, `"`) {
		return "", false
	}
	return name, true
}

// pfPrint prints a rule as pfctl -s does: an anchor call is
// `<type> "<name>" all` (pfctl_parser.c print_rule, print_fromto), the
// others as loaded.
func pfPrint(l string) string {
	if name, ok := pfAnchorCall(l); ok {
		return fmt.Sprintf("%s \"%s\" all", strings.Fields(l)[0], name)
	}
	return l
}

// pfStatus prints the first block of pfctl_parser.c print_status: the
// status line padded to 44 columns, then the debug level (the kernel
// starts at PF_DEBUG_URGENT) right-justified in 15.
func (c *call) pfStatus() {
	state := "Enabled"
	if c.st.PF.Disabled {
		state = "Disabled"
	}
	d := int(time.Since(c.st.PF.Since).Seconds())
	line := fmt.Sprintf("Status: %s for %d days %02d:%02d:%02d", state, d/86400, d/3600%24, d/60%60, d%60)
	c.outf("%-44s%15s\n\n", line, "Debug: Urgent")
}

func pfLineOK(l string) bool {
	f := strings.Fields(l)
	if f[0] == "pass" {
		return true
	}
	if _, ok := pfAnchorCall(l); ok {
		return true
	}
	if f[0] != "rdr" {
		return false
	}
	f = f[1:]
	if len(f) > 0 && f[0] == "pass" {
		f = f[1:]
	}
	// on <if> inet proto tcp from any to <dst> port <n> -> <addr> port <n>
	return len(f) == 15 && f[0] == "on" && f[2] == "inet" && f[3] == "proto" && f[4] == "tcp" &&
		f[5] == "from" && f[6] == "any" && f[7] == "to" && f[9] == "port" && isPort(f[10]) &&
		f[11] == "->" && looksLikeInet(f[12]) && f[13] == "port" && isPort(f[14])
}

func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0 && n < 65536
}

const psUsage = "usage: ps [-aCcdefHhjlmrSTuvwXxZ] [-O fmt | -o fmt] [-G gid[,gid...]]\n" +
	"          [-J jid[,jid...]] [-M core] [-N system]\n" +
	"          [-p pid[,pid...]] [-t tty[,tty...]] [-U user[,user...]]\n" +
	"       ps [-L]\n"

// cmdPs is ps(1) for the jails' processes (bin/ps/ps.c: usage exit 1;
// -J jid, -p pid, -o field[=header]; a field with "=" and an empty
// header prints no header line, docs/freebsd-notes.md §1.5). Fields:
// pid, ppid, jid, state (stat), lstart, etimes, command (args), comm.
func cmdPs(c *call, args []string) int {
	r := getopt("ps", args, "aCcde"+"fG:hjJ:LlM:mN:O:o:p:rSTt:U:uvwXxZ")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+psUsage)
		return 1
	}
	var jids, pids map[int]bool
	var fields, headers []string
	header := false
	for _, o := range r.opts {
		switch o.c {
		case 'J':
			jids = map[int]bool{}
			for _, s := range strings.Split(o.arg, ",") {
				n, err := strconv.Atoi(s)
				if err != nil {
					j := c.st.Jail(s)
					if j == nil {
						fmt.Fprintf(c.errb, "ps: Invalid jail id: %s\n", s)
						return 1
					}
					n = j.JID
				}
				jids[n] = true
			}
		case 'p':
			pids = map[int]bool{}
			for _, s := range strings.Split(o.arg, ",") {
				// ps.c addelem_pid: warnx("Invalid %s: %s", "process id"),
				// then exit 1 once the options are read (optfatal).
				n, err := strconv.Atoi(s)
				if err != nil || n < 0 {
					fmt.Fprintf(c.errb, "ps: Invalid process id: %s\n", s)
					return 1
				}
				pids[n] = true
			}
		case 'o':
			for _, f := range psParseFmt(o.arg) {
				name, hdr, has := strings.Cut(f, "=")
				if !has {
					hdr = psHeaders[name]
				}
				if hdr != "" {
					header = true
				}
				if _, ok := psHeaders[name]; !ok {
					fmt.Fprintf(c.errb, "ps: %s: keyword not found\nps: no valid keywords; valid keywords:\n", name)
					return 1
				}
				fields = append(fields, name)
				headers = append(headers, hdr)
			}
		case 'a', 'x', 'w', 'd', 'e', 'h':
		default:
			fmt.Fprintf(c.errb, "fbsdsim: ps -%c is not modelled\n", o.c)
			return 1
		}
	}
	if len(fields) == 0 {
		fields, header = []string{"pid", "state", "command"}, true
		headers = []string{"PID", "STAT", "COMMAND"}
	}
	var rows [][]string
	procs := append([]Proc(nil), c.st.Procs...)
	sort.Slice(procs, func(a, b int) bool { return procs[a].Pid < procs[b].Pid })
	for _, p := range procs {
		if jids != nil && !jids[p.JID] || pids != nil && !pids[p.Pid] {
			continue
		}
		var row []string
		for _, f := range fields {
			row = append(row, psField(p, f))
		}
		rows = append(rows, row)
	}
	if header {
		rows = append([][]string{headers}, rows...)
	}
	w := make([]int, len(fields))
	for _, row := range rows {
		for i, v := range row {
			w[i] = max(w[i], len(v))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, v := range row {
			if i > 0 {
				b.WriteByte(' ')
			}
			switch fields[i] {
			case "pid", "ppid", "jid", "etimes":
				fmt.Fprintf(&b, "%*s", w[i], v)
			default:
				if i == len(row)-1 {
					b.WriteString(v)
				} else {
					fmt.Fprintf(&b, "%-*s", w[i], v)
				}
			}
		}
		c.outf("%s\n", b.String())
	}
	if len(rows) == 0 || header && len(rows) == 1 {
		return 1
	}
	return 0
}

// psHeaders are the modelled keywords' headers (bin/ps/keyword.c).
var psHeaders = map[string]string{
	"pid": "PID", "ppid": "PPID", "jid": "JID", "state": "STAT", "stat": "STAT",
	"lstart": "STARTED", "etimes": "ELAPSED", "command": "COMMAND", "args": "COMMAND", "comm": "COMMAND",
}

// psParseFmt splits an -o argument as bin/ps/keyword.c parsefmt does: on
// blanks and commas, except that an item with "=" is the last one, its
// header running to the end of the argument.
func psParseFmt(arg string) []string {
	var items []string
	for arg != "" {
		i := strings.IndexAny(arg, "= \t,\n")
		if i >= 0 && arg[i] == '=' {
			return append(items, arg)
		}
		if i < 0 {
			return append(items, arg)
		}
		if i > 0 {
			items = append(items, arg[:i])
		}
		arg = arg[i+1:]
	}
	return items
}

func psField(p Proc, f string) string {
	switch f {
	case "pid":
		return strconv.Itoa(p.Pid)
	case "ppid":
		return "1"
	case "jid":
		return strconv.Itoa(p.JID)
	case "state", "stat":
		// bin/ps/print.c state(): the state letter, then the flags; J
		// for a process in a jail.
		st := "S"
		if p.Exited {
			st = "Z"
		} else if p.Real {
			if l, _, ok := procStat(p.Pid); ok {
				st = string(l)
			}
		}
		if p.JID != 0 {
			st += "J"
		}
		return st
	case "lstart":
		return p.Start.Format("Mon Jan _2 15:04:05 2006")
	case "etimes":
		return strconv.Itoa(int(time.Since(p.Start).Seconds()))
	case "comm":
		if len(p.Argv) == 0 {
			return ""
		}
		s := p.Argv[0]
		if i := strings.LastIndexByte(s, '/'); i >= 0 {
			s = s[i+1:]
		}
		return s
	}
	return strings.Join(p.Argv, " ")
}

const killUsage = "usage: kill [-s signal_name] pid ...\n" +
	"       kill -l [exit_status]\n" +
	"       kill -signal_name pid ...\n" +
	"       kill -signal_number pid ...\n"

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2, "0": 0,
}

// cmdKill is kill(1) (bin/kill/kill.c: usage exit 2; "kill: %s: No such
// process" per failed pid, exit 1). Only processes recorded in a jail are
// signalled: the simulator never signals an unrelated pid of the host.
func cmdKill(c *call, args []string) int {
	sig := syscall.SIGTERM
	rest := args
	switch {
	case len(args) >= 2 && args[0] == "-s":
		name := strings.TrimPrefix(strings.ToUpper(args[1]), "SIG")
		s, ok := signals[name]
		if !ok {
			fmt.Fprintf(c.errb, "kill: unknown signal %s; valid signals:\n", args[1])
			return 2
		}
		sig, rest = s, args[2:]
	case len(args) >= 1 && strings.HasPrefix(args[0], "-") && args[0] != "-s" && args[0] != "--":
		name := strings.TrimPrefix(strings.ToUpper(args[0][1:]), "SIG")
		if n, err := strconv.Atoi(name); err == nil {
			name = map[int]string{0: "0", 1: "HUP", 2: "INT", 3: "QUIT", 9: "KILL", 15: "TERM"}[n]
		}
		s, ok := signals[name]
		if !ok {
			fmt.Fprintf(c.errb, "kill: unknown signal %s; valid signals:\n", args[0][1:])
			return 2
		}
		sig, rest = s, args[1:]
	}
	if len(rest) == 0 {
		fmt.Fprint(c.errb, killUsage)
		return 2
	}
	status := 0
	for _, a := range rest {
		pid, err := strconv.Atoi(a)
		if err != nil {
			// kill.c main: warnx, errors = 1, next pid.
			fmt.Fprintf(c.errb, "kill: illegal process id: %s\n", a)
			status = 1
			continue
		}
		found := false
		for i := range c.st.Procs {
			p := &c.st.Procs[i]
			if p.Pid == pid {
				found = true
				if err := c.s.signalProc(c.st, p, sig); err != nil {
					fmt.Fprintf(c.errb, "kill: %s: No such process\n", a)
					status = 1
				}
			}
		}
		if !found {
			// kill.c: warn("%s", *argv).
			fmt.Fprintf(c.errb, "kill: %s: No such process\n", a)
			status = 1
		}
	}
	return status
}
