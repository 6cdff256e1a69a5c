package fbsdsim

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// jailUsage is usage() in usr.sbin/jail/jail.c; jailOpts is main's
// getopt string there.
const jailOpts = "cde:f:hiJ:lmn:p:qrRs:u:U:v"

const jailUsage = "usage: jail [-dhilqv] [-J jid_file] [-u username] [-U username]\n" +
	"            -[cmr] param=value ... [command=command ...]\n" +
	"       jail [-dqv] [-f file] [-e separator] -[cmr] [jail]\n" +
	"       jail [-qv] [-f file] -[rR] ['*' | jail ...]\n" +
	"       jail [-dhilqv] [-J jid_file] [-u username] [-U username]\n" +
	"            [-n jailname] [-s securelevel]\n" +
	"            path hostname [ip[,...]] command ...\n"

// jail(8)'s internal parameters (usr.sbin/jail/config.c intparams) and
// the kernel parameters modelled (security.jail.param.*, read by libjail
// jailparam_init). kind: s string, i int, b bool, sys jailsys
// (new/inherit/disable), l list.
var jailParams = map[string]string{
	"jid": "i", "name": "s", "path": "s", "persist": "b", "vnet": "sys",
	"host.hostname": "s", "devfs_ruleset": "i", "securelevel": "i",
	"enforce_statfs": "i", "children.max": "i", "ip4.addr": "l", "ip4": "sys",
	"ip6.addr": "l", "ip6": "sys", "osrelease": "s", "osreldate": "i",
	"allow.set_hostname": "b", "allow.sysvipc": "b", "allow.raw_sockets": "b",
	"allow.chflags": "b", "allow.mount": "b", "allow.mount.devfs": "b",
	"allow.mount.nullfs": "b", "allow.mount.zfs": "b", "allow.socket_af": "b",
	"allow.mlock": "b", "allow.reserved_ports": "b",
}

var jailIntParams = map[string]string{
	"allow.dying": "b", "command": "s", "depend": "s", "exec.clean": "b",
	"exec.consolelog": "s", "exec.fib": "i", "exec.jail_user": "s",
	"exec.poststart": "s", "exec.poststop": "s", "exec.prepare": "s",
	"exec.prestart": "s", "exec.prestop": "s", "exec.release": "s",
	"exec.created": "s", "exec.start": "s", "exec.stop": "s",
	"exec.system_jail_user": "b", "exec.system_user": "s", "exec.timeout": "i",
	"interface": "s", "ip_hostname": "b", "mount": "s", "mount.devfs": "b",
	"mount.fdescfs": "b", "mount.procfs": "b", "mount.fstab": "s",
	"stop.timeout": "i", "vnet.interface": "s",
}

// splitNo separates a "no" prefix on a parameter's last component
// (nopersist, allow.noraw_sockets), as equalopts/bool_param do.
func splitNo(name string) (string, bool) {
	i := strings.LastIndex(name, ".")
	head, last := name[:i+1], name[i+1:]
	if strings.HasPrefix(last, "no") {
		if _, k := jailParams[head+last[2:]]; k {
			return head + last[2:], true
		}
		if _, k := jailIntParams[head+last[2:]]; k {
			return head + last[2:], true
		}
	}
	return name, false
}

// cmdJail is `jail -c param...` (usr.sbin/jail/jail.c main, config.c
// add_param/check_intparams/import_params, command.c run_command).
// `jail -r` goes to Sim.jailRemove.
func cmdJail(c *call, args []string) int {
	r := getopt("jail", args, jailOpts)
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+jailUsage)
		return 1
	}
	create := false
	for _, o := range r.opts {
		switch o.c {
		case 'c':
			create = true
		case 'm', 'n', 's', 'u', 'U', 'l', 'J', 'h', 'i', 'f', 'p', 'e', 'r', 'R':
			fmt.Fprintf(c.errb, "fbsdsim: jail -%c is not modelled\n", o.c)
			return 1
		}
	}
	switch {
	case !create && len(r.rest) >= 4 && strings.HasPrefix(r.rest[0], "/"):
		// jail.c main: the old command line, path hostname ip command.
		fmt.Fprint(c.errb, "fbsdsim: jail's old command line (path hostname ip command) is not modelled\n")
		return 1
	case !create:
		fmt.Fprint(c.errb, jailUsage)
		return 1
	case len(r.rest) == 0 || (len(r.rest) == 1 && !strings.Contains(r.rest[0], "=")):
		// jail.c main: the config-file form (jail -c [name]) reads
		// /etc/jail.conf, which is not modelled.
		fmt.Fprint(c.errb, "fbsdsim: jail -c from /etc/jail.conf is not modelled\n")
		return 1
	}
	vals := map[string]string{}
	for _, a := range r.rest {
		k, v, hasV := strings.Cut(a, "=")
		if k == "command" {
			fmt.Fprintf(c.errb, "fbsdsim: jail -c command=... is not modelled (use persist and jexec)\n")
			return 1
		}
		base, neg := splitNo(k)
		kind, kern := jailParams[base]
		if !kern {
			kind = jailIntParams[base]
		}
		if kind == "" {
			// libjail jailparam_init: "unknown parameter: %s".
			fmt.Fprintf(c.errb, "jail: unknown parameter: %s\n", k)
			return 1
		}
		switch {
		case kind == "b" && !hasV:
			v = strconv.FormatBool(!neg)
		case kind == "b":
			if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
				if _, err := strconv.Atoi(v); err != nil {
					fmt.Fprintf(c.errb, "jail: %s: unknown boolean value \"%s\"\n", k, v)
					return 1
				}
			}
			if n, err := strconv.Atoi(v); err == nil {
				v = strconv.FormatBool(n != 0)
			}
			if neg {
				b, _ := strconv.ParseBool(strings.ToLower(v))
				v = strconv.FormatBool(!b)
			}
		case kind == "sys" && !hasV:
			v = "new"
			if neg {
				v = "inherit"
			}
		case kind == "i":
			if _, err := strconv.Atoi(v); err != nil {
				fmt.Fprintf(c.errb, "jail: %s: non-integer value \"%s\"\n", k, v)
				return 1
			}
		case kind == "s" && !hasV:
			fmt.Fprintf(c.errb, "jail: %s: missing value\n", k)
			return 1
		}
		vals[base] = v
	}
	name := vals["name"]
	if name == "" {
		if jid := vals["jid"]; jid != "" {
			name = jid
		}
	}
	if name == "" {
		fmt.Fprintf(c.errb, "fbsdsim: jail -c without name= is not modelled\n")
		return 1
	}
	if c.st.Jail(name) != nil {
		// jail.c main, JF_START: jail_quoted_warnx(j, "already exists").
		fmt.Fprintf(c.errb, "jail: \"%s\" already exists\n", name)
		return 1
	}
	path := vals["path"]
	devfs := vals["mount.devfs"] == "true"
	if devfs {
		if path == "" {
			fmt.Fprintf(c.errb, "jail: mount.devfs: no path\n")
			return 1
		}
		// command.c check_path: every component of <path>/dev below the
		// jail's path is lstat'ed.
		dev := strings.TrimSuffix(path, "/") + "/dev"
		if fi, err := os.Lstat(c.path(dev)); err != nil {
			fmt.Fprintf(c.errb, "jail: mount.devfs: %s: No such file or directory\n", dev)
			return 1
		} else if fi.Mode()&os.ModeSymlink != 0 {
			fmt.Fprintf(c.errb, "jail: mount.devfs: %s is a symbolic link\n", dev)
			return 1
		}
	}
	if path != "" {
		// jail.c create_jail: "with a better error message than jail_set
		// gives".
		if !strings.HasPrefix(path, "/") {
			fmt.Fprintf(c.errb, "jail: path %s: not an absolute pathname\n", path)
			return 1
		}
		fi, err := os.Stat(c.path(path))
		if err != nil {
			fmt.Fprintf(c.errb, "jail: path %s: No such file or directory\n", path)
			return 1
		}
		if !fi.IsDir() {
			fmt.Fprintf(c.errb, "jail: path %s: Not a directory\n", path)
			return 1
		}
	}
	if vals["persist"] != "true" {
		// A jail with no process and no persist goes away as soon as it is
		// created; nothing is left.
		return 0
	}
	ruleset := 4
	if v := vals["devfs_ruleset"]; v != "" {
		ruleset, _ = strconv.Atoi(v)
	}
	if devfs {
		// command.c IP_MOUNT_DEVFS: mount -t devfs -oruleset=<n> . <path>/dev
		c.st.Mounts = append(c.st.Mounts, Mount{From: "devfs", On: strings.TrimSuffix(path, "/") + "/dev", FSType: "devfs", Opts: "rw,multilabel"})
	}
	c.st.LastJID++
	host := vals["host.hostname"]
	if host == "" {
		host = c.st.Sysctl["kern.hostname"]
	}
	j := &Jail{Name: name, JID: c.st.LastJID, Path: path, VNet: vals["vnet"] == "new", Persist: true,
		DevfsRuleset: ruleset, Hostname: host, Created: time.Now()}
	c.st.Jails[name] = j
	if j.VNet {
		c.st.Ifaces = append(c.st.Ifaces, &Iface{Name: "lo0", VNet: name, Kind: "loopback", Unit: -1})
	}
	return 0
}

// cmdJls is jls(8) (usr.sbin/jls/jls.c main: getopt "adj:hNnqsv";
// usage "usage: jls [-dhNnqv] [-j jail] [param ...]", exit 1).
func cmdJls(c *call, args []string) int {
	r := getopt("jls", args, "adj:hNnqsv")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+"jls: usage: jls [-dhNnqv] [-j jail] [param ...]\n")
		return 1
	}
	var jname string
	dying, header, names, nameval, quoted := false, false, false, false, false
	for _, o := range r.opts {
		switch o.c {
		case 'a', 'd':
			dying = true
		case 'j':
			jname = o.arg
		case 'h':
			header = true
		case 'N':
			names = true
		case 'n':
			nameval = true
		case 'q':
			quoted = true
		case 's', 'v':
			fmt.Fprintf(c.errb, "fbsdsim: jls -%c is not modelled\n", o.c)
			return 1
		}
	}
	for _, p := range r.rest {
		if _, ok := jailParams[p]; !ok && p != "dying" {
			fmt.Fprintf(c.errb, "jls: unknown parameter: %s\n", p)
			return 1
		}
	}
	var jails []*Jail
	if jname != "" {
		j := lookupJail(c.st, jname)
		if j == nil && dying {
			for _, x := range c.st.Jails {
				if x.Name == jname {
					j = x
				}
			}
		}
		if j == nil {
			// libjail jail_getid/jailparam_get: the kernel's errmsg.
			fmt.Fprintf(c.errb, "jls: jail \"%s\" not found\n", jname)
			return 1
		}
		jails = []*Jail{j}
	} else {
		for _, j := range c.st.Jails {
			if !j.Dying || dying {
				jails = append(jails, j)
			}
		}
		sort.Slice(jails, func(a, b int) bool { return jails[a].JID < jails[b].JID })
	}
	if len(r.rest) == 0 && !nameval && !header {
		if names {
			c.outf(" %-15s %-15s %-29s %s\n", "JID", "IP Address", "Hostname", "Path")
		} else {
			c.outf("%6s  %s%6s%s%22s%s\n", "JID", "IP Address", "", "Hostname", "", "Path")
		}
		for _, j := range jails {
			if names {
				c.outf(" %-15s ", j.Name)
			} else {
				c.outf("%6d  ", j.JID)
			}
			c.outf("%-15.15s %-29.29s %.74s\n", "", j.Hostname, j.Path)
		}
		return 0
	}
	params := r.rest
	if len(params) == 0 {
		params = []string{"jid", "name", "path", "host.hostname", "vnet", "persist", "devfs_ruleset", "dying"}
	}
	if header {
		c.outf("%s\n", strings.Join(params, " "))
	}
	for _, j := range jails {
		var cells []string
		for _, p := range params {
			v := jailValue(j, p)
			if v == "" && !nameval {
				if quoted {
					v = `""`
				} else {
					v = "-"
				}
			} else if quoted && strings.ContainsAny(v, " \t") {
				v = `"` + v + `"`
			}
			if nameval {
				switch jailParams[p] {
				case "b":
					if v == "false" {
						i := strings.LastIndex(p, ".")
						cells = append(cells, p[:i+1]+"no"+p[i+1:])
					} else {
						cells = append(cells, p)
					}
					continue
				}
				v = p + "=" + v
			}
			cells = append(cells, v)
		}
		c.outf("%s\n", strings.Join(cells, " "))
	}
	return 0
}

func jailValue(j *Jail, p string) string {
	switch p {
	case "jid":
		return strconv.Itoa(j.JID)
	case "name":
		return j.Name
	case "path":
		return j.Path
	case "host.hostname":
		return j.Hostname
	case "vnet":
		if j.VNet {
			return "new"
		}
		return "inherit"
	case "persist":
		return strconv.FormatBool(j.Persist)
	case "dying":
		return strconv.FormatBool(j.Dying)
	case "devfs_ruleset":
		return strconv.Itoa(j.DevfsRuleset)
	case "securelevel", "enforce_statfs", "children.max":
		return "-1"
	}
	return ""
}
