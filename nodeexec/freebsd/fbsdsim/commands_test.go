package fbsdsim

import (
	"strings"
	"testing"
)

// TestCommandTexts checks accepted and refused forms of each command
// against the texts cited in the code (sources in MODEL.md).
func TestCommandTexts(t *testing.T) {
	s, root := host(t)
	_ = root
	must(t, s, "zfs", "snapshot", "zroot/keel/base/test@keel")
	must(t, s, "zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/web")
	must(t, s, "jail", "-c", "name=keel-web", "path=/zroot/keel/jails/web", "vnet", "persist")
	must(t, s, "jail", "-c", "name=keel-plain", "path=/zroot/keel/jails/web", "persist")
	must(t, s, "zfs", "create", "-o", "quota=1G", "zroot/keel/volumes/data")
	must(t, s, "mount", "-t", "nullfs", "/zroot/keel/volumes/data", "/zroot/keel/jails/web/tmp")
	must(t, s, "ifconfig", "bridge", "create")
	must(t, s, "ifconfig", "bridge0", "name", "keel0")
	must(t, s, "ifconfig", "keel0", "inet", "10.0.60.1/24", "alias")
	must(t, s, "ifconfig", "epair1", "create")
	must(t, s, "ifconfig", "keel0", "addm", "epair1a")
	must(t, s, "route", "add", "-net", "10.0.207.0/24", "192.0.2.20")

	cases := []struct {
		name   string
		argv   []string
		code   int
		stdout string
		stderr string // exact, or a prefix when it ends in "..."
	}{
		{"clone of a missing snapshot", []string{"zfs", "clone", "zroot/keel/base/test@gone", "zroot/keel/jails/x"}, 1, "",
			"cannot open 'zroot/keel/base/test@gone': dataset does not exist\n"},
		{"clone onto an existing dataset", []string{"zfs", "clone", "zroot/keel/base/test@keel", "zroot/keel/jails/web"}, 1, "",
			"cannot create 'zroot/keel/jails/web': dataset already exists\n"},
		{"clone without the parent", []string{"zfs", "clone", "zroot/keel/base/test@keel", "zroot/nope/x"}, 1, "",
			"cannot create 'zroot/nope/x': parent does not exist\n"},
		{"destroy a dataset busy with a nullfs mount of it", []string{"zfs", "destroy", "zroot/keel/volumes/data"}, 1, "",
			"cannot unmount '/zroot/keel/volumes/data': pool or dataset is busy\n"},
		{"destroy a jail root while the jail lives", []string{"zfs", "destroy", "zroot/keel/jails/web"}, 1, "",
			"cannot unmount '/zroot/keel/jails/web': pool or dataset is busy\n"},
		{"destroy a dataset with snapshots", []string{"zfs", "destroy", "zroot/keel/base/test"}, 1, "",
			"cannot destroy 'zroot/keel/base/test': filesystem has children\nuse '-r' to destroy the following datasets:\nzroot/keel/base/test@keel\n"},
		{"destroy a snapshot with clones", []string{"zfs", "destroy", "zroot/keel/base/test@keel"}, 1, "",
			"cannot destroy 'zroot/keel/base/test@keel': snapshot has dependent clones\nuse '-R' to destroy the following datasets:\nzroot/keel/jails/web\n"},
		{"destroy a missing dataset", []string{"zfs", "destroy", "zroot/keel/jails/gone"}, 1, "",
			"cannot open 'zroot/keel/jails/gone': dataset does not exist\n"},
		{"create an existing dataset", []string{"zfs", "create", "zroot/keel/volumes/data"}, 1, "",
			"cannot create 'zroot/keel/volumes/data': dataset already exists\n"},
		{"create -p an existing dataset", []string{"zfs", "create", "-p", "zroot/keel/volumes/data"}, 0, "", ""},
		{"snapshot twice", []string{"zfs", "snapshot", "zroot/keel/base/test@keel"}, 1, "",
			"cannot create snapshot 'zroot/keel/base/test@keel': dataset already exists\n"},
		{"zfs unknown flag", []string{"zfs", "list", "-Z"}, 2, "", "zfs: invalid option -- Z\ninvalid option 'Z'\nusage:\n\tlist [-Hp]..."},
		{"zfs get missing argument", []string{"zfs", "get", "-o"}, 2, "", "missing argument for 'o' option\nusage:\n..."},
		{"zfs set a bad quota", []string{"zfs", "set", "quota=lots", "zroot/keel/volumes/data"}, 1, "",
			"cannot set property for 'zroot/keel/volumes/data': bad numeric value 'lots'\n"},
		{"zfs set quota", []string{"zfs", "set", "quota=2G", "zroot/keel/volumes/data"}, 0, "", ""},
		{"zfs list a tree", []string{"zfs", "list", "-H", "-o", "name,origin", "-r", "zroot/keel/jails"}, 0,
			"zroot/keel/jails\t-\nzroot/keel/jails/web\tzroot/keel/base/test@keel\n", ""},

		{"jail unknown parameter", []string{"jail", "-c", "name=x", "path=/zroot", "bogus=1", "persist"}, 1, "", "jail: unknown parameter: bogus\n"},
		{"jail existing name", []string{"jail", "-c", "name=keel-web", "path=/zroot/keel/jails/web", "persist"}, 1, "", "jail: \"keel-web\" already exists\n"},
		{"jail missing path", []string{"jail", "-c", "name=x", "path=/nowhere", "persist"}, 1, "", "jail: path /nowhere: No such file or directory\n"},
		{"jail devfs without <path>/dev", []string{"jail", "-c", "name=x", "path=/zroot/keel/volumes/data", "mount.devfs", "persist"}, 1, "",
			"jail: mount.devfs: /zroot/keel/volumes/data/dev: No such file or directory\n"},
		{"jail -r missing", []string{"jail", "-r", "keel-gone"}, 1, "", "jail: \"keel-gone\" not found\n"},
		{"jail unknown flag", []string{"jail", "-Q"}, 1, "", "jail: illegal option -- Q\nusage: jail [-dhilqv]..."},
		{"jls missing jail", []string{"jls", "-j", "keel-gone", "jid"}, 1, "", "jls: jail \"keel-gone\" not found\n"},
		{"jls unknown flag", []string{"jls", "-Q"}, 1, "", "jls: illegal option -- Q\njls: usage: jls [-dhNnqv] [-j jail] [param ...]\n"},
		{"jls params", []string{"jls", "-j", "keel-web", "jid", "name", "vnet"}, 0, "1 keel-web new\n", ""},
		{"jexec missing jail", []string{"jexec", "keel-gone", "/sbin/ifconfig"}, 1, "", "jexec: jail \"keel-gone\" not found\n"},

		{"vnet into a jail without vnet", []string{"ifconfig", "epair1b", "vnet", "keel-plain"}, 1, "", "ifconfig: SIOCSIFVNET: File exists\n"},
		{"vnet into a missing jail", []string{"ifconfig", "epair1b", "vnet", "keel-gone"}, 1, "", "ifconfig: jail \"keel-gone\" not found\n"},
		{"epair created twice", []string{"ifconfig", "epair1", "create"}, 1, "", "ifconfig: interface epair1 already exists\n"},
		{"addm twice", []string{"ifconfig", "keel0", "addm", "epair1a"}, 1, "", "ifconfig: BRDGADD epair1a: File exists\n"},
		{"gateway alias twice", []string{"ifconfig", "keel0", "inet", "10.0.60.1/24", "alias"}, 1, "", "ifconfig: ioctl (SIOCAIFADDR): File exists\n"},
		{"-alias absent", []string{"ifconfig", "keel0", "-alias", "10.0.60.77"}, 1, "", "ifconfig: ioctl (SIOCDIFADDR): Can't assign requested address\n"},
		{"VIP alias", []string{"ifconfig", "keel0", "alias", "10.0.99.7", "netmask", "255.255.255.255"}, 0, "", ""},
		{"missing interface", []string{"ifconfig", "epair9a", "destroy"}, 1, "", "ifconfig: interface epair9a does not exist\n"},
		{"ifconfig -l", []string{"ifconfig", "-l"}, 0, "lo0 em0 keel0 epair1a epair1b\n", ""},

		{"route that exists", []string{"route", "add", "-net", "10.0.207.0/24", "192.0.2.20"}, 1,
			"add net 10.0.207.0/24: gateway 192.0.2.20 fib 0: route already in table\n", "route: message indicates error: File exists\n"},
		{"route delete absent", []string{"route", "delete", "-net", "10.0.208.0/24"}, 1,
			"delete net 10.0.208.0/24 fib 0: not in table\n", "route: route has not been found\n"},
		{"route via an unreachable gateway", []string{"route", "add", "-net", "10.0.209.0/24", "172.16.0.1"}, 1,
			"add net 10.0.209.0/24: gateway 172.16.0.1 fib 0: Network is unreachable\n", "route: message indicates error: Network is unreachable\n"},
		{"route delete", []string{"route", "delete", "-net", "10.0.207.0/24"}, 0, "delete net 10.0.207.0/24\n", ""},
		{"route unknown flag", []string{"route", "-Z", "add"}, 64, "", "route: illegal option -- Z\nroute: usage: route [-46dnqtv] command [[modifiers] args]\n"},

		{"rctl -r with no rules", []string{"rctl", "-r", "jail:keel-web"}, 1, "", "rctl: failed to remove rule 'jail:keel-web': No such process\n"},
		{"rctl bad rule", []string{"rctl", "-a", "jail:keel-web:bogus:deny=1"}, 1, "", "rctl: failed to add rule 'jail:keel-web:bogus:deny=1': Invalid argument\n"},
		{"rctl unknown flag", []string{"rctl", "-Z"}, 1, "", "rctl: illegal option -- Z\nusage: rctl [ -h ] [-a rule | -l filter | -r filter | -u filter | filter]\n"},

		{"sysctl", []string{"sysctl", "-n", "hw.ncpu", "hw.physmem"}, 0, "4\n8589934592\n", ""},
		{"sysctl unknown oid", []string{"sysctl", "-n", "hw.bogus"}, 1, "", "sysctl: unknown oid 'hw.bogus'\n"},
		{"sysctl racct is a tunable", []string{"sysctl", "kern.racct.enable=1"}, 1, "", "sysctl: oid 'kern.racct.enable' is a read only tunable\nsysctl: Tunable values are set in /boot/loader.conf\n"},

		{"umount of no mount point", []string{"umount", "/zroot/keel/jails/web/etc"}, 1, "", "umount: /zroot/keel/jails/web/etc: not a file system root directory\n"},
		{"umount unknown flag", []string{"umount", "-Z", "/x"}, 1, "", "umount: illegal option -- Z\nusage: umount [-fNnv]..."},
		{"nullfs onto a missing directory", []string{"mount", "-t", "nullfs", "/zroot/keel/volumes/data", "/zroot/keel/jails/web/missing"}, 1, "",
			"mount: /zroot/keel/jails/web/missing: No such file or directory\n"},
		{"mount unknown flag", []string{"mount", "-Z"}, 1, "", "mount: illegal option -- Z\nusage: mount [-adflpruvw]..."},

		{"ps unknown flag", []string{"ps", "-Q"}, 1, "", "ps: illegal option -- Q\nusage: ps [-aCcdefHhjlmrSTuvwXxZ]..."},
		{"ps no process", []string{"ps", "-J", "1", "-o", "state="}, 1, "", ""},
		{"kill no such process", []string{"kill", "-s", "TERM", "99999"}, 1, "", "kill: 99999: No such process\n"},
		{"kill usage", []string{"kill"}, 2, "", "usage: kill [-s signal_name] pid ...\n..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, s, tc.argv...)
			if res.Code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", res.Code, tc.code, res.Stderr)
			}
			if string(res.Stdout) != tc.stdout && !(tc.code != 0 && tc.stdout == "" && len(res.Stdout) == 0) {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			if p, ok := strings.CutSuffix(tc.stderr, "..."); ok {
				if !strings.HasPrefix(string(res.Stderr), p) {
					t.Errorf("stderr %q, want prefix %q", res.Stderr, p)
				}
			} else if string(res.Stderr) != tc.stderr {
				t.Errorf("stderr %q, want %q", res.Stderr, tc.stderr)
			}
		})
	}
}

// TestRacctDisabledAndPF checks the node-level refusals: rctl with
// kern.racct.enable=0, pfctl without pf.ko, and a pf anchor load.
func TestRacctDisabledAndPF(t *testing.T) {
	s, root := host(t)
	s.SetSysctl("kern.racct.enable", "0")
	res := run(t, s, "rctl", "-a", "jail:keel-web:pcpu:deny=200")
	if res.Code != 1 || string(res.Stderr) != "rctl: RACCT/RCTL present, but disabled; enable using kern.racct.enable=1 tunable\n" {
		t.Fatalf("rctl with racct off: %d %q", res.Code, res.Stderr)
	}
	rules := "rdr pass on em0 inet proto tcp from any to em0 port 80 -> 10.0.0.2 port 80\n" +
		"rdr pass on em0 inet proto tcp from any to em0 port 443 -> 10.0.0.2 port 443\n"
	if err := writeFile(root, "/usr/local/etc/keel/pf.conf", rules); err != nil {
		t.Fatal(err)
	}
	s.SetPF(false)
	res = run(t, s, "pfctl", "-a", "keel", "-f", "/usr/local/etc/keel/pf.conf")
	if res.Code != 1 || string(res.Stderr) != "pfctl: /dev/pf: No such file or directory\n" {
		t.Fatalf("pfctl without pf: %d %q", res.Code, res.Stderr)
	}
	s.SetPF(true)
	must(t, s, "pfctl", "-a", "keel", "-f", "/usr/local/etc/keel/pf.conf")
	if got := must(t, s, "pfctl", "-a", "keel", "-s", "nat"); got != rules {
		t.Fatalf("pfctl -s nat = %q", got)
	}
	if err := writeFile(root, "/tmp/bad.conf", "rdr on em0 bogus\n"); err != nil {
		t.Fatal(err)
	}
	res = run(t, s, "pfctl", "-a", "keel", "-f", "/tmp/bad.conf")
	if res.Code != 1 || string(res.Stderr) != "/tmp/bad.conf:1: syntax error\npfctl: Syntax error in config file: pf rules not loaded\n" {
		t.Fatalf("bad rules: %d %q", res.Code, res.Stderr)
	}
	if got := must(t, s, "pfctl", "-a", "keel", "-s", "nat"); got != rules {
		t.Fatalf("a failed load changed the anchor: %q", got)
	}
	s.FailNext([]string{"zfs", "clone"}, "injected\n", 3)
	if res := run(t, s, "zfs", "clone", "a@b", "c"); res.Code != 3 || string(res.Stderr) != "injected\n" {
		t.Fatalf("FailNext: %d %q", res.Code, res.Stderr)
	}
}
