// Package fbsdsim is a stateful, in-memory model of the FreeBSD userland
// the freebsd driver runs: ZFS datasets and snapshots, mounts, jails and
// their processes, interfaces (bridges, epairs, aliases), per-VNET routing
// tables, rctl rules, sysctls and pf anchors. Each command parses its argv
// as the real one does (BSD getopt, no permutation) and answers with the
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
//     the quota or 10G; quotas are recorded, never enforced; no volumes
//     (-V), no send/receive, no zfs mount/unmount/rename/promote/inherit,
//     no -j JSON output, no user properties.
//   - zfs usage texts list only the modelled subcommands and properties.
//   - jail.conf and the config-file forms of jail(8); jail -m; command=,
//     exec.* hooks, ip4.addr (no IP jails), mount.fstab; jls -s/-v and
//     libxo output; the hostname of a jail is kern.hostname unless set.
//   - jexec of any program other than /sbin/ifconfig and /sbin/route
//     through Runner.Run; users (-u/-U); the in-process jexec workload
//     never writes to its stdout/stderr files.
//   - nullfs contents: a nullfs mount is recorded, the mirror directory of
//     its target does not show the source's files.
//   - mount -p lists the ZFS datasets, devfs and nullfs mounts the model
//     made, not the host's / or /dev.
//   - IPv6, interface groups, media, MTU changes, ifconfig -j, bridge STP;
//     MAC addresses are derived from the name.
//   - route: netmask arguments, -iface, -fib, multiple FIBs (net.fibs=1),
//     route show/flush/monitor, netstat; route -n get prints fixed metrics.
//   - rctl -u (usage), -l (limits), loginclass/user name resolution;
//     rules are never enforced.
//   - sysctl: only the oids in State.Sysctl exist; only
//     net.inet.ip.forwarding and kern.hostname are writable.
//   - pf: rules are echoed as loaded (pfctl's normalised print is not
//     reproduced), only rdr/pass lines parse, no tables, states or the
//     main ruleset; enable/disable is not modelled.
//   - ps shows only the processes started in jails; ppid is 1; a
//     simulated process is always in state S (or Z once ended).
//   - kill signals only pids recorded as jail processes.
package fbsdsim
