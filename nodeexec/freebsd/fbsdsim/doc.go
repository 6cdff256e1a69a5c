// Package fbsdsim is a stateful, in-memory model of the FreeBSD userland
// the freebsd driver runs: ZFS datasets and snapshots, mounts, jails and
// their processes, interfaces (bridges, epairs, aliases), per-VNET routing
// tables, rctl rules, sysctls and pf anchors. Each command parses its argv
// as the real one does (BSD getopt without permutation; getopt_long, which
// permutes, for zfs list and get) and answers with the
// real output formats and error texts; every text cites its source in
// freebsd/freebsd-src or docs/freebsd-notes.md next to the code, and
// MODEL.md lists them all.
//
// It is used two ways: in-process through New, which implements
// freebsd.Runner (the jexec workloads are simulated processes), and as a
// multi-call executable (cmd/fbsdsim, installed with Install) whose
// invocations share the state in <root>/.fbsdsim/state.json under an
// flock; there jexec really runs (or blocks as) a process and ps, kill
// and jail -r act on real pids. Every mounted ZFS dataset is mirrored as a
// real directory under the root at its mountpoint; snapshots copy the
// tree under <root>/.fbsdsim/snapshots, clones start from that copy.
//
// Not modelled (a command outside the model fails with an "fbsdsim: ...
// is not modelled" message rather than pretending):
//   - ZFS space accounting: used/referenced are a fixed 96K, available is
//     the quota or 10G; quotas and readonly=on are recorded, never
//     enforced; no volumes (-V), no send/receive, no zfs
//     mount/unmount/rename/promote/inherit, no -j JSON output or other
//     long options; user properties are kept and inherited, but the
//     length of their values is not checked; zfs get all lists only the
//     modelled properties (and the object's user properties, sorted),
//     zfs get -d and zfs snapshot -r are not modelled; of zfs_open's name
//     checks only invalid characters; zfs list/get of a path instead of a
//     dataset name.
//   - zfs usage texts list only the modelled subcommands and properties.
//   - jail.conf and the config-file forms of jail(8), the old command
//     line (path hostname ip command), -e, -R and wildcards; jail -m; command=,
//     exec.* hooks, ip4.addr (no IP jails), mount.fstab; jls -s/-v and
//     libxo output; the hostname of a jail is kern.hostname unless set.
//   - jexec of any program other than /sbin/ifconfig and /sbin/route
//     through Runner.Run (RunCheck, for health checks, runs the host's
//     program, as the executable's jexec does, not recorded as a process
//     of the jail); jexec without a command (the shell); users (-u/-U);
//     the in-process jexec workload never writes to its stdout/stderr
//     files; env(1) options other than -i, and env without a command.
//   - nullfs contents: a nullfs mount is recorded, the mirror directory of
//     its target does not show the source's files; nullfs mounts of or on
//     files.
//   - mount -p lists the ZFS datasets, devfs and nullfs mounts the model
//     made, not the host's / or /dev.
//   - IPv6, interface groups, media, MTU changes, ifconfig -j, bridge STP,
//     destination addresses; MAC addresses are derived from the name.
//   - route: netmask arguments, -iface, -fib, multiple FIBs (net.fibs=1),
//     route show/flush/monitor, netstat; route -n get prints fixed metrics,
//     and its "route has not been found" lacks warn()'s ": <strerror>".
//   - rctl -u (usage), -l (limits), loginclass/user name resolution;
//     rules are never enforced.
//   - sysctl: only the oids in State.Sysctl exist; only
//     net.inet.ip.forwarding and kern.hostname are writable.
//   - pf: rules are echoed as loaded (pfctl's normalised print, e.g. an
//     interface resolved to its addresses, ports as names, "flags S/SA keep
//     state", is not reproduced), only rdr/pass lines and anchor calls
//     parse; no tables, states, recursion (-a x/*), -F other than nat and
//     rules, -s other than nat, rules, Anchors and info; -s info prints its
//     first block only.
//   - ps shows only the processes started in jails; ppid is 1; a
//     simulated process is always in state SJ (or ZJ once ended); an
//     unknown -o keyword among valid ones is fatal (ps warns and goes on).
//   - kill signals only pids recorded as jail processes.
package fbsdsim
