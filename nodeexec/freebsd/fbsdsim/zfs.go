package fbsdsim

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The zfs(8) subcommands Keel uses, from OpenZFS's
// sys/contrib/openzfs/cmd/zfs/zfs_main.c (usage texts: get_usage; getopt
// strings: zfs_do_<command>) and lib/libzfs (error texts:
// libzfs_dataset.c zfs_open/check_parents/zfs_create/zfs_clone,
// libzfs_mount.c unmount_one, libzfs_util.c zfs_verror "%s: %s\n").

var zfsUsage = map[string]string{
	"clone":    "\tclone [-p] [-o property=value] ... <snapshot> <filesystem|volume>\n",
	"create":   "\tcreate [-Pnpuv] [-o property=value] ... <filesystem>\n\tcreate [-Pnpsv] [-b blocksize] [-o property=value] ... -V <size> <volume>\n",
	"destroy":  "\tdestroy [-fnpRrv] <filesystem|volume>\n\tdestroy [-dnpRrv] <filesystem|volume>@<snap>[%<snap>][,...]\n\tdestroy <filesystem|volume>#<bookmark>\n",
	"get":      "\tget [-rHp] [-j [--json-int]] [-d max] [-o \"all\" | field[,...]]\n\t    [-t type[,...]] [-s source[,...]]\n\t    <\"all\" | property[,...]> [filesystem|volume|snapshot|bookmark] ...\n",
	"list":     "\tlist [-Hp] [-j [--json-int]] [-r|-d max] [-o property[,...]] [-s property]...\n\t    [-S property]... [-t type[,...]] [filesystem|volume|snapshot] ...\n",
	"set":      "\tset [-u] <property=value> ... <filesystem|volume|snapshot> ...\n",
	"snapshot": "\tsnapshot [-r] [-o property=value] ... <filesystem|volume>@<snap> ...\n",
}

// zfsProps are the properties modelled: name → (editable, inheritable,
// values) as usage_prop_cb prints them.
var zfsProps = []struct{ name, edit, inherit, values string }{
	{"available", " NO    ", "   NO   ", "<size>"},
	{"mounted", " NO    ", "   NO   ", "yes | no"},
	{"origin", " NO    ", "   NO   ", "<snapshot>"},
	{"referenced", " NO    ", "   NO   ", "<size>"},
	{"type", " NO    ", "   NO   ", "filesystem | volume | snapshot | bookmark"},
	{"used", " NO    ", "   NO   ", "<size>"},
	{"mountpoint", "YES    ", "  YES   ", "<path> | legacy | none"},
	{"quota", "YES    ", "   NO   ", "<size> | none"},
	{"readonly", "YES    ", "  YES   ", "on | off"},
}

func zfsUsageExit(c *call, sub string) int {
	fmt.Fprintf(c.errb, "usage:\n%s", zfsUsage[sub])
	switch sub {
	case "set", "get", "list":
		fmt.Fprintf(c.errb, "\nThe following properties are supported:\n\n\t%-21s %s  %s   %s\n\n", "PROPERTY", "EDIT", "INHERIT", "VALUES")
		for _, p := range zfsProps {
			fmt.Fprintf(c.errb, "\t%-22s %s%s%s\n", p.name, p.edit, p.inherit, p.values)
		}
		fmt.Fprintf(c.errb, "\nSizes are specified in bytes with standard units such as K, M, G, etc.\n")
		fmt.Fprintf(c.errb, "\nUser-defined properties can be specified by using a name containing a colon (:).\n")
	default:
		fmt.Fprintf(c.errb, "\nFor the property list, run: %s\n", "zfs set|get")
		fmt.Fprintf(c.errb, "\nFor the delegated permission list, run: %s\n", "zfs allow|unallow")
		fmt.Fprintf(c.errb, "\nFor further help on a command or topic, run: %s\n", "zfs help [<topic>]")
	}
	return 2
}

func cmdZFS(c *call, args []string) int {
	if len(args) == 0 {
		fmt.Fprintf(c.errb, "missing command\n")
		return zfsGenericUsage(c)
	}
	sub := args[0]
	if sub == "snap" {
		sub = "snapshot"
	}
	switch sub {
	case "list":
		return zfsList(c, args)
	case "get":
		return zfsGet(c, args)
	case "set":
		return zfsSet(c, args)
	case "create":
		return zfsCreate(c, args)
	case "clone":
		return zfsClone(c, args)
	case "snapshot":
		return zfsSnapshot(c, args)
	case "destroy":
		return zfsDestroy(c, args)
	}
	fmt.Fprintf(c.errb, "unrecognized command '%s'\n", sub)
	return zfsGenericUsage(c)
}

func zfsGenericUsage(c *call) int {
	fmt.Fprintf(c.errb, "usage: zfs command args ...\nwhere 'command' is one of the following:\n\n")
	for _, n := range []string{"create", "destroy", "", "snapshot", "clone", "", "list", "", "set", "get"} {
		if n == "" {
			fmt.Fprintln(c.errb)
			continue
		}
		fmt.Fprint(c.errb, zfsUsage[n])
	}
	fmt.Fprintf(c.errb, "\nEach dataset is of the form: pool/[dataset/]*dataset[@name]\n")
	return 2
}

// zfsGetopt runs getopt (getopt_long for list and get, which take
// --json) and prints zfs's own complaint for a bad option ("invalid
// option 'c'", or with a leading ':' optstring "missing argument for 'c'
// option", which zfs_do_create words "missing size argument") before the
// usage.
func zfsGetopt(c *call, sub string, args []string, optstring string) (getoptResult, int, bool) {
	var r getoptResult
	if sub == "list" || sub == "get" {
		var long string
		if r, long = getoptLong("zfs", args, optstring); long != "" {
			fmt.Fprintf(c.errb, "fbsdsim: zfs %s %s: long options are not modelled\n", sub, long)
			return r, 2, false
		}
	} else {
		r = getopt("zfs", args, optstring)
	}
	if r.bad == 0 {
		return r, 0, true
	}
	c.errb.Write([]byte(r.msg)) //nolint:errcheck
	switch {
	case r.missing && optstring[0] == ':' && sub == "create":
		fmt.Fprintf(c.errb, "missing size argument\n")
	case r.missing && optstring[0] == ':':
		fmt.Fprintf(c.errb, "missing argument for '%c' option\n", r.bad)
	default:
		fmt.Fprintf(c.errb, "invalid option '%c'\n", r.bad)
	}
	return r, zfsUsageExit(c, sub), false
}

// openErr is zfs_open's failure (lib/libzfs/libzfs_dataset.c): a name
// with a character zfs_namecheck.c valid_char refuses is "invalid
// character"; the other namecheck reasons are not modelled.
func openErr(c *call, name string) int {
	for _, r := range name {
		valid := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.: %/@#", r)
		if !valid {
			fmt.Fprintf(c.errb, "cannot open '%s': invalid character '%c' in name\n", name, r)
			return 1
		}
	}
	fmt.Fprintf(c.errb, "cannot open '%s': dataset does not exist\n", name)
	return 1
}

// parseSize is zfs_nicestrtonum (lib/libzfs/libzfs_util.c): a number
// with an optional K/M/G/T/P/E suffix (optionally followed by B or iB),
// 1024-based; "none" is 0 for quota.
func parseSize(v string) (uint64, bool) {
	if v == "none" {
		return 0, true
	}
	s := strings.ToUpper(v)
	s = strings.TrimSuffix(strings.TrimSuffix(s, "IB"), "B")
	mult := 1.0
	if n := len(s); n > 0 {
		if i := strings.IndexByte("KMGTPE", s[n-1]); i >= 0 {
			mult = math.Pow(1024, float64(i+1))
			s = s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || s == "" {
		return 0, false
	}
	return uint64(f * mult), true
}

// nicenum is zfs_nicenum_format (lib/libzfs/libzfs_util.c) for bytes:
// exact multiples print as "64M", others with up to two decimals in at
// most five characters.
func nicenum(n uint64) string {
	units := "BKMGTPE"
	i := 0
	v := n
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%dB", n)
	}
	div := math.Pow(1024, float64(i))
	if n%uint64(div) == 0 {
		return fmt.Sprintf("%d%c", v, units[i])
	}
	for p := 2; p >= 0; p-- {
		s := fmt.Sprintf("%.*f%c", p, float64(n)/div, units[i])
		if len(s) <= 5 || p == 0 {
			return s
		}
	}
	return ""
}

func (c *call) mounted(ds string) bool {
	for _, m := range c.st.Mounts {
		if m.FSType == "zfs" && m.From == ds {
			return true
		}
	}
	return false
}

// propValue returns a dataset's or snapshot's property value and source
// as zfs get shows them; ok is false for an unknown property.
func (c *call) propValue(name, prop string, literal bool) (string, string, bool) {
	snap := strings.Contains(name, "@")
	var d *Dataset
	if !snap {
		d = c.st.Datasets[name]
	}
	if userProp(prop) {
		v, src := c.userPropValue(name, prop)
		return v, src, true
	}
	switch prop {
	case "name":
		return name, "-", true
	case "type":
		if snap {
			return "snapshot", "-", true
		}
		return "filesystem", "-", true
	case "used", "referenced", "refer":
		if literal {
			return "98304", "-", true
		}
		return "96K", "-", true
	case "available", "avail":
		if snap {
			return "-", "-", true
		}
		if q := quotaOf(d); q > 0 {
			if literal {
				return strconv.FormatUint(q, 10), "-", true
			}
			return nicenum(q), "-", true
		}
		if literal {
			return "10737418240", "-", true
		}
		return "10G", "-", true
	case "origin":
		if snap || d.Origin == "" {
			return "-", "-", true
		}
		return d.Origin, "-", true
	case "mounted":
		if snap {
			return "-", "-", true
		}
		if c.mounted(name) {
			return "yes", "-", true
		}
		return "no", "-", true
	case "quota":
		if snap {
			return "-", "-", true
		}
		q := quotaOf(d)
		src := "default"
		if _, ok := d.Props["quota"]; ok && q > 0 {
			src = "local"
		}
		if q == 0 {
			if literal {
				return "0", src, true
			}
			return "none", src, true
		}
		if literal {
			return strconv.FormatUint(q, 10), src, true
		}
		return nicenum(q), src, true
	case "readonly":
		// Valid for filesystems and volumes only (zfs_prop.c
		// zfs_prop_init: ZFS_TYPE_FILESYSTEM | ZFS_TYPE_VOLUME), so a
		// snapshot shows "-"; inherited, "off" by default.
		if snap {
			return "-", "-", true
		}
		if v, ok := d.Props["readonly"]; ok {
			return v, "local", true
		}
		for p := parentName(name); p != ""; p = parentName(p) {
			if pd := c.st.Datasets[p]; pd != nil {
				if v, ok := pd.Props["readonly"]; ok {
					return v, "inherited from " + p, true
				}
			}
		}
		return "off", "default", true
	case "mountpoint":
		if snap {
			return "-", "-", true
		}
		if _, ok := d.Props["mountpoint"]; ok {
			return c.st.mountpoint(name), "local", true
		}
		for p := parentName(name); p != ""; p = parentName(p) {
			if pd := c.st.Datasets[p]; pd != nil {
				if _, ok := pd.Props["mountpoint"]; ok {
					return c.st.mountpoint(name), "inherited from " + p, true
				}
			}
		}
		return c.st.mountpoint(name), "default", true
	}
	return "", "", false
}

// userProp is zfs_prop_user (module/zcommon/zfs_prop.c): a user
// property's name holds only lowercase letters, digits, '-', '_', '.' and
// ':', and at least one ':'.
func userProp(name string) bool {
	sep := false
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		case r == ':':
			sep = true
		default:
			return false
		}
	}
	return sep
}

// userPropValue is a user property as zfs get shows it (zfs_main.c
// get_callback): set on the object itself, "local"; else inherited, for
// a snapshot from its dataset and that dataset's ancestors, for a
// dataset from its ancestors (user properties "are always inherited":
// zfsprops(7)), "inherited from <name>"; else "-" with source "-".
func (c *call) userPropValue(name, prop string) (string, string) {
	if ds, _, ok := strings.Cut(name, "@"); ok {
		if sn := c.st.Snapshots[name]; sn != nil {
			if v, ok := sn.Props[prop]; ok {
				return v, "local"
			}
		}
		name = ds
		if d := c.st.Datasets[ds]; d != nil {
			if v, ok := d.Props[prop]; ok {
				return v, "inherited from " + ds
			}
		}
	} else if d := c.st.Datasets[name]; d != nil {
		if v, ok := d.Props[prop]; ok {
			return v, "local"
		}
	}
	for p := parentName(name); p != ""; p = parentName(p) {
		if pd := c.st.Datasets[p]; pd != nil {
			if v, ok := pd.Props[prop]; ok {
				return v, "inherited from " + p
			}
		}
	}
	return "-", "-"
}

// userProps lists the user properties an object has, its own and
// inherited, sorted by name.
func (c *call) userProps(name string) []string {
	seen := map[string]bool{}
	add := func(props map[string]string) {
		for k := range props {
			if userProp(k) {
				seen[k] = true
			}
		}
	}
	if sn := c.st.Snapshots[name]; sn != nil {
		add(sn.Props)
	}
	for p, _, _ := strings.Cut(name, "@"); p != ""; p = parentName(p) {
		if d := c.st.Datasets[p]; d != nil {
			add(d.Props)
		}
	}
	return sortedKeys(seen)
}

func quotaOf(d *Dataset) uint64 {
	if d == nil {
		return 0
	}
	q, _ := strconv.ParseUint(d.Props["quota"], 10, 64)
	return q
}

func parentName(n string) string {
	if i := strings.LastIndex(n, "/"); i >= 0 {
		return n[:i]
	}
	return ""
}

func validProp(p string) bool {
	if p == "name" || p == "refer" || p == "avail" || userProp(p) {
		return true
	}
	for _, z := range zfsProps {
		if z.name == p {
			return true
		}
	}
	return false
}

// zfsList is `zfs list` (zfs_do_list: getopt_long "jHS:d:o:prs:t:").
func zfsList(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "list", args[1:], "jHS:d:o:prs:t:")
	if !ok {
		return code
	}
	fields := []string{"name", "used", "avail", "refer", "mountpoint"}
	scripted, literal, recurse, depth := false, false, false, -1
	types := map[string]bool{"filesystem": true}
	typesSet := false
	for _, o := range r.opts {
		switch o.c {
		case 'H':
			scripted = true
		case 'p':
			literal = true
		case 'r':
			recurse = true
		case 'd':
			n, err := strconv.Atoi(o.arg)
			if err != nil {
				fmt.Fprintf(c.errb, "%s is not an integer\n", o.arg)
				return zfsUsageExit(c, "list")
			}
			recurse, depth = true, n
		case 'o':
			fields = strings.Split(o.arg, ",")
			for _, f := range fields {
				if !validProp(f) {
					fmt.Fprintf(c.errb, "bad property list: invalid property '%s'\n", f)
					return zfsUsageExit(c, "list")
				}
			}
		case 't':
			types, typesSet = map[string]bool{}, true
			for _, t := range strings.Split(o.arg, ",") {
				switch t {
				case "filesystem", "fs":
					types["filesystem"] = true
				case "snapshot", "snap":
					types["snapshot"] = true
				case "volume", "vol", "bookmark":
					types[t] = true
				case "all":
					types["filesystem"], types["snapshot"] = true, true
				default:
					fmt.Fprintf(c.errb, "invalid type '%s'\n", t)
					return zfsUsageExit(c, "list")
				}
			}
		case 'j', 's', 'S':
			fmt.Fprintf(c.errb, "fbsdsim: zfs list -%c is not modelled\n", o.c)
			return 2
		}
	}
	// zfs_do_list: "zfs list -t snapshot <dataset>" lists the dataset's
	// snapshots (an implied -d 1).
	onlySnaps := typesSet && len(types) == 1 && types["snapshot"]
	if onlySnaps && len(r.rest) > 0 && !recurse {
		recurse, depth = true, 1
	}
	// zfs_for_each (cmd/zfs/zfs_iter.c) gathers every argument's
	// datasets into one tree sorted by zfs_compare, without duplicates,
	// then prints it.
	picked := map[string]bool{}
	status := 0
	add := func(n string) { picked[n] = true }
	if len(r.rest) == 0 {
		for _, n := range c.allNames() {
			if types[typeOf(n)] {
				add(n)
			}
		}
	}
	for _, a := range r.rest {
		if !c.exists(a) {
			status = openErr(c, a)
			continue
		}
		if strings.Contains(a, "@") {
			if !typesSet || types["snapshot"] {
				add(a)
			}
			continue
		}
		if types["filesystem"] {
			add(a)
		}
		if recurse {
			for _, n := range c.allNames() {
				if n == a || !strings.HasPrefix(n, a+"/") && !strings.HasPrefix(n, a+"@") || !types[typeOf(n)] {
					continue
				}
				if depth >= 0 && strings.Count(strings.TrimPrefix(n, a), "/")+strings.Count(n, "@") > depth {
					continue
				}
				add(n)
			}
		}
	}
	var names []string
	for _, n := range c.allNames() {
		if picked[n] {
			names = append(names, n)
		}
	}
	rows := [][]string{}
	for _, n := range names {
		row := []string{}
		for _, f := range fields {
			v, _, _ := c.propValue(n, f, literal)
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	printTable(c, fields, rows, scripted)
	if status == 0 && len(rows) == 0 && !scripted {
		fmt.Fprintf(c.errb, "no datasets available\n")
	}
	return status
}

func typeOf(n string) string {
	if strings.Contains(n, "@") {
		return "snapshot"
	}
	return "filesystem"
}

// allNames lists datasets and snapshots in zfs list's order: by name,
// each dataset's snapshots after it by creation.
func (c *call) allNames() []string {
	ds := sortedKeys(c.st.Datasets)
	var out []string
	for _, d := range ds {
		out = append(out, d)
		var snaps []*Snapshot
		for _, s := range c.st.Snapshots {
			if strings.HasPrefix(s.Name, d+"@") {
				snaps = append(snaps, s)
			}
		}
		sort.Slice(snaps, func(i, j int) bool { return snaps[i].TXG < snaps[j].TXG })
		for _, s := range snaps {
			out = append(out, s.Name)
		}
	}
	return out
}

func (c *call) exists(n string) bool {
	if strings.Contains(n, "@") {
		return c.st.Snapshots[n] != nil
	}
	return c.st.Datasets[n] != nil
}

// printTable prints -H rows tab-separated, or a header and columns
// padded to their widths (print_header/print_dataset in zfs_main.c).
// The header comes with the first row (list_callback), so nothing at all
// is printed without rows.
func printTable(c *call, fields []string, rows [][]string, scripted bool) {
	if len(rows) == 0 {
		return
	}
	if scripted {
		for _, r := range rows {
			c.outf("%s\n", strings.Join(r, "\t"))
		}
		return
	}
	w := make([]int, len(fields))
	for i, f := range fields {
		w[i] = len(f)
		for _, r := range rows {
			w[i] = max(w[i], len(r[i]))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, s := range cells {
			if i == len(cells)-1 {
				b.WriteString(s)
			} else {
				fmt.Fprintf(&b, "%-*s  ", w[i], s)
			}
		}
		c.outf("%s\n", strings.TrimRight(b.String(), " "))
	}
	hdr := make([]string, len(fields))
	for i, f := range fields {
		hdr[i] = strings.ToUpper(f)
	}
	line(hdr)
	for _, r := range rows {
		line(r)
	}
}

// zfsGet is `zfs get` (zfs_do_get: getopt_long ":d:o:s:jrt:Hp";
// get_callback prints the rows, zprop_collect_property drops those whose
// source -s leaves out).
func zfsGet(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "get", args[1:], ":d:o:s:jrt:Hp")
	if !ok {
		return code
	}
	cols := []string{"name", "property", "value", "source"}
	scripted, literal, recurse, depth := false, false, false, -1
	var sources, types map[string]bool // nil: all
	for _, o := range r.opts {
		switch o.c {
		case 'H':
			scripted = true
		case 'p':
			literal = true
		case 'r':
			recurse = true
		case 'o':
			cols = nil
			for _, t := range strings.Split(o.arg, ",") {
				switch t {
				case "name", "property", "value", "source":
					cols = append(cols, t)
				case "all":
					cols = []string{"name", "property", "value", "received", "source"}
				case "received":
					cols = append(cols, t)
				default:
					fmt.Fprintf(c.errb, "invalid column name '%s'\n", t)
					return zfsUsageExit(c, "get")
				}
			}
		case 's':
			sources = map[string]bool{}
			for _, t := range strings.Split(o.arg, ",") {
				switch t {
				case "local", "default", "inherited", "received", "temporary", "none":
					sources[t] = true
				default:
					fmt.Fprintf(c.errb, "invalid source '%s'\n", t)
					return zfsUsageExit(c, "get")
				}
			}
		case 't':
			types = map[string]bool{}
			for _, t := range strings.Split(o.arg, ",") {
				switch t {
				case "filesystem", "fs":
					types["filesystem"] = true
				case "snapshot", "snap":
					types["snapshot"] = true
				case "volume", "vol", "bookmark":
					types[t] = true
				case "all":
					types["filesystem"], types["snapshot"] = true, true
				default:
					fmt.Fprintf(c.errb, "invalid type '%s'\n", t)
					return zfsUsageExit(c, "get")
				}
			}
		default:
			fmt.Fprintf(c.errb, "fbsdsim: zfs get -%c is not modelled\n", o.c)
			return 2
		}
	}
	if len(r.rest) < 1 {
		fmt.Fprintf(c.errb, "missing property argument\n")
		return zfsUsageExit(c, "get")
	}
	// zprop_get_list: "all" alone is every property of each object.
	all := r.rest[0] == "all"
	var props []string
	if !all {
		props = strings.Split(r.rest[0], ",")
		for _, p := range props {
			if !validProp(p) {
				fmt.Fprintf(c.errb, "bad property list: invalid property '%s'\n", p)
				return zfsUsageExit(c, "get")
			}
		}
	}
	// zfs_do_get: "zfs get -t snapshot <prop> <dataset>" gets the
	// dataset's snapshots (an implied -d 1).
	if len(types) == 1 && types["snapshot"] && len(r.rest) > 1 && !recurse {
		recurse, depth = true, 1
	}
	typeOK := func(n string) bool { return types == nil || types[typeOf(n)] }
	status := 0
	var rows [][]string
	emit := func(n string) {
		list := props
		if all {
			// Every modelled property that applies to the object
			// (get_callback skips, with pl_all, those zfs_prop_get
			// fails for), then its user properties.
			list = nil
			for _, z := range zfsProps {
				if v, _, _ := c.propValue(n, z.name, literal); v != "-" {
					list = append(list, z.name)
				}
			}
			list = append(list, c.userProps(n)...)
		}
		for _, p := range list {
			v, src, _ := c.propValue(n, p, literal)
			kind := src
			switch {
			case src == "-":
				kind = "none"
			case strings.HasPrefix(src, "inherited from "):
				kind = "inherited"
			}
			if sources != nil && !sources[kind] {
				continue
			}
			var row []string
			for _, col := range cols {
				switch col {
				case "name":
					row = append(row, n)
				case "property":
					row = append(row, p)
				case "value":
					row = append(row, v)
				case "received":
					row = append(row, "-")
				case "source":
					row = append(row, src)
				}
			}
			rows = append(rows, row)
		}
	}
	// zfs_for_each (cmd/zfs/zfs_iter.c) gathers every argument's objects
	// into one tree sorted by zfs_compare, without duplicates.
	picked := map[string]bool{}
	for _, a := range r.rest[1:] {
		if !c.exists(a) {
			status = openErr(c, a)
			continue
		}
		// zfs_for_each: with -r a filesystem is always accepted as an
		// argument (and printed only when -t asks for its type);
		// without, zfs_open of another type fails with EZFS_BADTYPE.
		if !typeOK(a) && (!recurse || typeOf(a) != "filesystem") {
			fmt.Fprintf(c.errb, "cannot open '%s': operation not applicable to datasets of this type\n", a)
			status = 1
			continue
		}
		if typeOK(a) {
			picked[a] = true
		}
		if recurse {
			for _, n := range c.allNames() {
				if !strings.HasPrefix(n, a+"/") && !strings.HasPrefix(n, a+"@") || !typeOK(n) {
					continue
				}
				if depth >= 0 && strings.Count(strings.TrimPrefix(n, a), "/")+strings.Count(n, "@") > depth {
					continue
				}
				picked[n] = true
			}
		}
	}
	for _, n := range c.allNames() {
		if picked[n] {
			emit(n)
		}
	}
	printTable(c, cols, rows, scripted)
	return status
}

// checkProp validates a property=value for set/create/clone as
// zfs_valid_proplist (lib/libzfs/libzfs_dataset.c) does.
func checkProp(k, v string) (string, string) {
	switch k {
	case "quota":
		n, ok := parseSize(v)
		if !ok {
			return "", fmt.Sprintf("bad numeric value '%s'", v)
		}
		return strconv.FormatUint(n, 10), ""
	case "mountpoint":
		if v != "none" && v != "legacy" && !strings.HasPrefix(v, "/") {
			return "", fmt.Sprintf("'%s' must be an absolute path, 'none', or 'legacy'", k)
		}
		return v, ""
	case "readonly":
		// zprop_parse_value (lib/libzfs/libzfs_util.c) of an index
		// property: "'%s' must be one of '%s'" with zprop_values.
		if v != "on" && v != "off" {
			return "", fmt.Sprintf("'%s' must be one of '%s'", k, "on | off")
		}
		return v, ""
	case "available", "avail", "mounted", "origin", "referenced", "refer", "type", "used", "name":
		return "", fmt.Sprintf("'%s' is readonly", k)
	}
	// zfs_valid_proplist: a user property is any string, never validated.
	if userProp(k) {
		return v, ""
	}
	return "", fmt.Sprintf("invalid property '%s'", k)
}

// msgSnapshotProp is zfs_valid_proplist's refusal of anything but a user
// property on a snapshot (lib/libzfs/libzfs_dataset.c: "Currently, only
// user properties can be modified on snapshots").
const msgSnapshotProp = "this property can not be modified for snapshots"

// zfsSet is `zfs set` (zfs_do_set: getopt "u").
func zfsSet(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "set", args[1:], "u")
	if !ok {
		return code
	}
	// zfs_do_set: the argument count, then the order (prop=val
	// arguments first; note its "ds_start > 0": a dataset first is not
	// caught, and then nothing is set).
	switch {
	case len(r.rest) < 1:
		fmt.Fprintf(c.errb, "missing arguments\n")
		return zfsUsageExit(c, "set")
	case len(r.rest) < 2 && !strings.Contains(r.rest[0], "="):
		fmt.Fprintf(c.errb, "missing property=value argument(s)\n")
		return zfsUsageExit(c, "set")
	case len(r.rest) < 2:
		fmt.Fprintf(c.errb, "missing dataset name(s)\n")
		return zfsUsageExit(c, "set")
	}
	dsStart := -1
	for i, a := range r.rest {
		if strings.Contains(a, "=") {
			if dsStart > 0 {
				fmt.Fprintf(c.errb, "invalid argument order\n")
				return zfsUsageExit(c, "set")
			}
		} else if dsStart < 0 {
			dsStart = i
		}
	}
	if dsStart < 0 {
		fmt.Fprintf(c.errb, "missing dataset name(s)\n")
		return zfsUsageExit(c, "set")
	}
	var kvs [][2]string
	for _, a := range r.rest[:dsStart] {
		k, v, _ := strings.Cut(a, "=")
		kvs = append(kvs, [2]string{k, v})
	}
	status := 0
	for _, ds := range r.rest[dsStart:] {
		// zfs_for_each over ZFS_TYPE_DATASET: a snapshot too, which
		// takes user properties only.
		if sn := c.st.Snapshots[ds]; sn != nil {
			if i := slices.IndexFunc(kvs, func(kv [2]string) bool { return !userProp(kv[0]) }); i >= 0 {
				fmt.Fprintf(c.errb, "cannot set property for '%s': %s\n", ds, msgSnapshotProp)
				status = 1
				continue
			}
			if sn.Props == nil {
				sn.Props = map[string]string{}
			}
			for _, kv := range kvs {
				sn.Props[kv[0]] = kv[1]
			}
			continue
		}
		d := c.st.Datasets[ds]
		if d == nil {
			status = openErr(c, ds)
			continue
		}
		for _, kv := range kvs {
			v, msg := checkProp(kv[0], kv[1])
			if msg != "" {
				fmt.Fprintf(c.errb, "cannot set property for '%s': %s\n", ds, msg)
				status = 1
				continue
			}
			if kv[0] == "mountpoint" {
				c.remount(ds, v)
				continue
			}
			d.Props[kv[0]] = v
		}
	}
	return status
}

// remount changes a dataset's mountpoint, moving its mirror directory
// (and its inheriting descendants') to the new place.
func (c *call) remount(ds, mp string) {
	old := c.st.mountpoint(ds)
	c.st.Datasets[ds].Props["mountpoint"] = mp
	nw := c.st.mountpoint(ds)
	if old == nw {
		return
	}
	if err := os.MkdirAll(filepath.Dir(c.path(nw)), 0o755); err == nil {
		_ = os.Rename(c.path(old), c.path(nw))
	}
	for i, m := range c.st.Mounts {
		if m.FSType == "zfs" && (m.From == ds || strings.HasPrefix(m.From, ds+"/")) {
			c.st.Mounts[i].On = c.st.mountpoint(m.From)
		}
	}
}

func parseProps(c *call, opts []opt) (map[string]string, bool) {
	props := map[string]string{}
	for _, o := range opts {
		if o.c != 'o' {
			continue
		}
		k, v, ok := strings.Cut(o.arg, "=")
		if !ok {
			fmt.Fprintf(c.errb, "missing '=' for property=value argument\n")
			return nil, false
		}
		if _, dup := props[k]; dup {
			fmt.Fprintf(c.errb, "property '%s' specified multiple times\n", k)
			return nil, false
		}
		props[k] = v
	}
	return props, true
}

// checkParents is check_parents (libzfs_dataset.c).
func (c *call) checkParents(target string) string {
	pool, _, _ := strings.Cut(target, "/")
	if c.st.Datasets[pool] == nil {
		return fmt.Sprintf("no such pool '%s'", pool)
	}
	if p := parentName(target); p != "" && c.st.Datasets[p] == nil {
		return "parent does not exist"
	}
	return ""
}

// newDataset records and mounts a dataset, copying from (a snapshot's
// directory) into its mirror directory when from is set. It returns
// the mount failure, if any, as zfs_mount_at reports it.
func (c *call) newDataset(name, origin, from string, props map[string]string) string {
	c.st.Seq++
	d := &Dataset{Name: name, Props: map[string]string{}, Origin: origin, TXG: c.st.Seq}
	for k, v := range props {
		d.Props[k] = v
	}
	c.st.Datasets[name] = d
	mp := c.st.mountpoint(name)
	if mp == "none" || mp == "legacy" {
		return ""
	}
	dir := c.path(mp)
	// libzfs_mount.c zfs_mount_at: "Determine if the mountpoint is empty.
	// If so, refuse to perform the mount" (no overlay on FreeBSD):
	// docs/freebsd-notes.md §10.27.
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return fmt.Sprintf("cannot mount '%s': directory is not empty\n", mp)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Sprintf("cannot mount '%s': %v\n", mp, err)
	}
	if from != "" {
		_ = copyTree(from, dir)
	}
	c.st.Mounts = append(c.st.Mounts, Mount{From: name, On: mp, FSType: "zfs", Opts: zfsOpts})
	return ""
}

// zfsCreate is `zfs create` (zfs_do_create: getopt ":PV:b:nso:puv").
func zfsCreate(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "create", args[1:], ":PV:b:nso:puv")
	if !ok {
		return code
	}
	parents := false
	for _, o := range r.opts {
		switch o.c {
		case 'p':
			parents = true
		case 'V', 'b', 's', 'n', 'P', 'v', 'u':
			fmt.Fprintf(c.errb, "fbsdsim: zfs create -%c is not modelled\n", o.c)
			return 2
		}
	}
	props, ok := parseProps(c, r.opts)
	if !ok {
		return 1
	}
	if len(r.rest) == 0 {
		fmt.Fprintf(c.errb, "missing filesystem argument\n")
		return zfsUsageExit(c, "create")
	}
	if len(r.rest) > 1 {
		fmt.Fprintf(c.errb, "too many arguments\n")
		return zfsUsageExit(c, "create")
	}
	return createDataset(c, r.rest[0], "", "", props, parents)
}

// createDataset is what zfs_do_create and zfs_do_clone share: with -p, an
// existing dataset is success and the missing ancestors are created
// (zfs_create_ancestors), before the properties are checked (zfs_create,
// zfs_clone); then the parent must exist and the name be free. A clone
// (origin set) is filled from dir, its snapshot's tree. A mount that fails
// leaves the dataset created (zfs_mount_and_share).
func createDataset(c *call, name, origin, dir string, props map[string]string, parents bool) int {
	if parents {
		if c.st.Datasets[name] != nil {
			return 0
		}
		pool, _, _ := strings.Cut(name, "/")
		if c.st.Datasets[pool] == nil {
			fmt.Fprintf(c.errb, "cannot create '%s': no such pool '%s'\n", name, pool)
			return 1
		}
		parts := strings.Split(name, "/")
		for i := 2; i < len(parts); i++ {
			if anc := strings.Join(parts[:i], "/"); c.st.Datasets[anc] == nil {
				if msg := c.newDataset(anc, "", "", nil); msg != "" {
					fmt.Fprintf(c.errb, "%s", msg)
					return 1
				}
			}
		}
	}
	for k, v := range props {
		nv, msg := checkProp(k, v)
		if msg != "" {
			fmt.Fprintf(c.errb, "cannot create '%s': %s\n", name, msg)
			return 1
		}
		props[k] = nv
	}
	if msg := c.checkParents(name); msg != "" {
		fmt.Fprintf(c.errb, "cannot create '%s': %s\n", name, msg)
		return 1
	}
	if c.st.Datasets[name] != nil {
		fmt.Fprintf(c.errb, "cannot create '%s': dataset already exists\n", name)
		return 1
	}
	if msg := c.newDataset(name, origin, dir, props); msg != "" {
		fmt.Fprintf(c.errb, "%sfilesystem successfully created, but not mounted\n", msg)
		return 1
	}
	return 0
}

// zfsClone is `zfs clone` (zfs_do_clone: getopt "o:p"; zfs_open of the
// snapshot, then libzfs zfs_clone).
func zfsClone(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "clone", args[1:], "o:p")
	if !ok {
		return code
	}
	props, ok := parseProps(c, r.opts)
	if !ok {
		return 1
	}
	parents := false
	for _, o := range r.opts {
		if o.c == 'p' {
			parents = true
		}
	}
	switch {
	case len(r.rest) < 1:
		fmt.Fprintf(c.errb, "missing source dataset argument\n")
		return zfsUsageExit(c, "clone")
	case len(r.rest) < 2:
		fmt.Fprintf(c.errb, "missing target dataset argument\n")
		return zfsUsageExit(c, "clone")
	case len(r.rest) > 2:
		fmt.Fprintf(c.errb, "too many arguments\n")
		return zfsUsageExit(c, "clone")
	}
	src, dst := r.rest[0], r.rest[1]
	if !strings.Contains(src, "@") {
		fmt.Fprintf(c.errb, "cannot open '%s': missing '@' delimiter in snapshot name\n", src)
		return 1
	}
	snap := c.st.Snapshots[src]
	if snap == nil {
		return openErr(c, src)
	}
	return createDataset(c, dst, src, c.path(snap.Dir), props, parents)
}

// zfsSnapshot is `zfs snapshot` (zfs_do_snapshot: getopt "ro:").
func zfsSnapshot(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "snapshot", args[1:], "ro:")
	if !ok {
		return code
	}
	for _, o := range r.opts {
		if o.c != 'o' {
			fmt.Fprintf(c.errb, "fbsdsim: zfs snapshot -%c is not modelled\n", o.c)
			return 2
		}
	}
	// parseprop runs as getopt meets each -o, before the arguments are
	// counted.
	props, ok := parseProps(c, r.opts)
	if !ok {
		return 1
	}
	if len(r.rest) == 0 {
		fmt.Fprintf(c.errb, "missing snapshot argument\n")
		return zfsUsageExit(c, "snapshot")
	}
	for _, a := range r.rest {
		ds, sn, ok := strings.Cut(a, "@")
		if !ok || sn == "" {
			return zfsUsageExit(c, "snapshot")
		}
		if c.st.Datasets[ds] == nil {
			openErr(c, ds)
			return zfsUsageExit(c, "snapshot")
		}
	}
	// zfs_snapshot_nvl: the properties are checked (zfs_valid_proplist
	// for ZFS_TYPE_SNAPSHOT, errbuf "cannot create snapshots ") before
	// lzc_snapshot creates them all at once, properties included.
	for k := range props {
		if !userProp(k) {
			fmt.Fprintf(c.errb, "cannot create snapshots : %s\n", msgSnapshotProp)
			return 1
		}
	}
	for _, a := range r.rest {
		if c.st.Snapshots[a] != nil {
			fmt.Fprintf(c.errb, "cannot create snapshot '%s': dataset already exists\n", a)
			return 1
		}
	}
	for _, a := range r.rest {
		ds, _, _ := strings.Cut(a, "@")
		c.st.Seq++
		dir := filepath.Join(".fbsdsim", "snapshots", fmt.Sprintf("%d-%s", c.st.Seq, strings.NewReplacer("/", "_", "@", "@").Replace(a)))
		skip := map[string]bool{}
		mp := c.st.mountpoint(ds)
		for _, m := range c.st.Mounts {
			if m.On != mp && under(m.On, mp) {
				skip[c.path(m.On)] = true
			}
		}
		if c.mounted(ds) {
			_ = copyTreeSkip(c.path(mp), c.path(dir), skip)
		} else {
			_ = os.MkdirAll(c.path(dir), 0o755)
		}
		sp := &Snapshot{Name: a, TXG: c.st.Seq, Dir: dir}
		if len(props) > 0 {
			sp.Props = maps.Clone(props)
		}
		c.st.Snapshots[a] = sp
	}
	return 0
}

// zfsDestroy is `zfs destroy` (zfs_do_destroy: getopt "vpndfrR",
// destroy_check_dependent, destroy_callback).
func zfsDestroy(c *call, args []string) int {
	r, code, ok := zfsGetopt(c, "destroy", args[1:], "vpndfrR")
	if !ok {
		return code
	}
	recurse, clones, dry, verbose := false, false, false, false
	for _, o := range r.opts {
		switch o.c {
		case 'r':
			recurse = true
		case 'R':
			recurse, clones = true, true
		case 'n':
			dry = true
		case 'v', 'p':
			verbose = true
		case 'd', 'f':
		}
	}
	if len(r.rest) == 0 {
		fmt.Fprintf(c.errb, "missing dataset argument\n")
		return zfsUsageExit(c, "destroy")
	}
	if len(r.rest) > 1 {
		fmt.Fprintf(c.errb, "too many arguments\n")
		return zfsUsageExit(c, "destroy")
	}
	target := r.rest[0]
	if ds, sn, ok := strings.Cut(target, "@"); ok {
		if c.st.Datasets[ds] == nil {
			return openErr(c, ds)
		}
		var snaps []string
		for _, n := range c.allNames() {
			if n == ds+"@"+sn || recurse && strings.HasPrefix(n, ds+"/") && strings.HasSuffix(n, "@"+sn) {
				snaps = append(snaps, n)
			}
		}
		if len(snaps) == 0 {
			fmt.Fprintf(c.errb, "could not find any snapshots to destroy; check snapshot names.\n")
			return 1
		}
		for _, s := range snaps {
			if deps := c.clonesOf(s); len(deps) > 0 && !clones {
				fmt.Fprintf(c.errb, "cannot destroy '%s': snapshot has dependent clones\nuse '-R' to destroy the following datasets:\n", s)
				for _, d := range deps {
					fmt.Fprintf(c.errb, "%s\n", d)
				}
				return 1
			}
		}
		if dry {
			return 0
		}
		status := 0
		for _, s := range snaps {
			for _, cl := range c.clonesOf(s) {
				if c.destroyTree(cl, verbose) != 0 {
					status = 1
				}
			}
			if c.st.Snapshots[s] != nil && c.clonesOf(s) == nil {
				c.removeSnapshot(s)
			}
		}
		return status
	}
	d := c.st.Datasets[target]
	if d == nil {
		return openErr(c, target)
	}
	if !recurse && !strings.Contains(target, "/") {
		fmt.Fprintf(c.errb, "cannot destroy '%s': operation does not apply to pools\nuse 'zfs destroy -r %s' to destroy all datasets in the pool\nuse 'zpool destroy %s' to destroy the pool itself\n", target, target, target)
		return 1
	}
	deps := c.dependents(target)
	if !clones {
		var children, cl []string
		for _, n := range deps {
			if strings.HasPrefix(n, target+"/") || strings.HasPrefix(n, target+"@") {
				children = append(children, n)
			} else {
				cl = append(cl, n)
			}
		}
		if !recurse && len(children) > 0 {
			fmt.Fprintf(c.errb, "cannot destroy '%s': filesystem has children\nuse '-r' to destroy the following datasets:\n", target)
			for _, n := range children {
				fmt.Fprintf(c.errb, "%s\n", n)
			}
			return 1
		}
		if recurse && len(cl) > 0 {
			fmt.Fprintf(c.errb, "cannot destroy '%s': filesystem has dependent clones\nuse '-R' to destroy the following datasets:\n", target)
			for _, n := range cl {
				fmt.Fprintf(c.errb, "%s\n", n)
			}
			return 1
		}
	}
	if dry {
		for _, n := range append(deps, target) {
			if verbose {
				c.outf("would destroy %s\n", n)
			}
		}
		return 0
	}
	return c.destroyTree(target, verbose)
}

// dependents lists what destroying name would take along: descendants,
// snapshots, and (transitively) clones of those snapshots, deepest first.
func (c *call) dependents(name string) []string {
	var out []string
	for _, n := range c.allNames() {
		if strings.HasPrefix(n, name+"/") || strings.HasPrefix(n, name+"@") {
			if strings.Contains(n, "@") {
				for _, cl := range c.clonesOf(n) {
					if !strings.HasPrefix(cl, name+"/") {
						out = append(out, c.dependents(cl)...)
						out = append(out, cl)
					}
				}
			}
			out = append(out, n)
		}
	}
	return out
}

func (c *call) clonesOf(snap string) []string {
	var out []string
	for _, n := range sortedKeys(c.st.Datasets) {
		if c.st.Datasets[n].Origin == snap {
			out = append(out, n)
		}
	}
	return out
}

// destroyTree destroys name and everything under it, children first. A
// filesystem is unmounted first; when that fails the dataset stays and
// the error is "cannot unmount '<mountpoint>': pool or dataset is busy"
// (libzfs_mount.c unmount_one, EBUSY → EZFS_BUSY).
func (c *call) destroyTree(name string, verbose bool) int {
	status := 0
	deps := c.dependents(name)
	// deepest datasets first, so that a parent's mountpoint is free.
	sort.SliceStable(deps, func(i, j int) bool { return strings.Count(deps[i], "/") > strings.Count(deps[j], "/") })
	for _, n := range append(deps, name) {
		if verbose {
			c.outf("will destroy %s\n", n)
		}
		if strings.Contains(n, "@") {
			if c.st.Snapshots[n] != nil && len(c.clonesOf(n)) == 0 {
				c.removeSnapshot(n)
			}
			continue
		}
		if c.st.Datasets[n] == nil {
			continue
		}
		if mp := c.st.mountpoint(n); c.mounted(n) {
			if c.busy(n, mp) {
				fmt.Fprintf(c.errb, "cannot unmount '%s': pool or dataset is busy\n", mp)
				status = 1
				continue
			}
			c.unmountZFS(n)
			_ = os.RemoveAll(c.path(mp))
		}
		for _, s := range sortedKeys(c.st.Snapshots) {
			if strings.HasPrefix(s, n+"@") && len(c.clonesOf(s)) == 0 {
				c.removeSnapshot(s)
			}
		}
		delete(c.st.Datasets, n)
	}
	return status
}

// busy reports whether unmount(2) of the dataset at mp would fail with
// EBUSY: something mounted below it, a nullfs mount of a directory in it,
// or a jail (alive, or dying with unreaped processes) rooted in it.
func (c *call) busy(ds, mp string) bool {
	for _, m := range c.st.Mounts {
		if m.On != mp && under(m.On, mp) {
			return true
		}
		if m.FSType == "nullfs" && under(m.From, mp) {
			return true
		}
	}
	for _, j := range c.st.Jails {
		if under(j.Path, mp) {
			return true
		}
	}
	return false
}

func (c *call) unmountZFS(ds string) {
	for i, m := range c.st.Mounts {
		if m.FSType == "zfs" && m.From == ds {
			c.st.Mounts = append(c.st.Mounts[:i], c.st.Mounts[i+1:]...)
			return
		}
	}
}

func (c *call) removeSnapshot(n string) {
	if s := c.st.Snapshots[n]; s != nil {
		_ = os.RemoveAll(c.path(s.Dir))
		delete(c.st.Snapshots, n)
	}
}

func copyTree(src, dst string) error { return copyTreeSkip(src, dst, nil) }

// copyTreeSkip copies the directory tree src to dst, leaving out the
// directories in skip (other file systems mounted below src).
func copyTreeSkip(src, dst string, skip map[string]bool) error {
	return filepath.WalkDir(src, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skip[p] {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			return os.MkdirAll(t, info.Mode().Perm()|0o700)
		case e.Type()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, t)
		case e.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(t, b, info.Mode().Perm())
		}
		return nil
	})
}
