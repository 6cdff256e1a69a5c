// Package freebsd is the driver that runs instances as FreeBSD jails: ZFS
// clones for roots and volumes, VNET jails on the node's bridge over epair
// pairs, nullfs mounts, rctl limits, kernel routes, VIP aliases and a pf
// anchor for ingress. Every command goes through a Runner as an argv, so
// that the driver runs unchanged against the simulator (package fbsdsim)
// in tests. Each command shape, output format and error text it relies on
// cites FreeBSD's sources (freebsd/freebsd-src) or docs/freebsd-notes.md
// in a comment; the parsers are tested on the outputs in testdata/.
//
// # Names and datasets
//
// Instance web-0 is the jail keel-web-0, whose root is the dataset
// <pool>/keel/jails/web-0 mounted at /<pool>/keel/jails/web-0 (the default
// mountpoint: Check reports a pool mounted elsewhere). Image base/x is the
// dataset <pool>/keel/base/x; the OCI image of digest sha256:<hex> is
// <pool>/keel/images/<hex> (see OCI images). Volume v is
// <pool>/keel/volumes/v, created with its quota. The operator creates
// <pool>/keel/jails, <pool>/keel/volumes and the base images; the only
// parent the driver creates is <pool>/keel/images, when it adds its first
// OCI image, without -p (a mistyped pool still fails). Every name and
// digest is checked (render's rules, oci.CheckDigest) before it reaches a
// path, a dataset or an argv, and only jails named keel-<instance>,
// datasets under <pool>/keel/jails and <pool>/keel/images and the aliases
// and routes the driver recorded are ever changed.
//
// # Snapshots and refreshed bases
//
// A new root is a clone of the image's newest snapshot named keel or
// keel-<suffix> (zfs list orders a dataset's snapshots by creation). A base
// with none gets <base>@keel, tolerating two provisions taking it at once.
// To refresh a base, change it and take a new snapshot, e.g.
// zfs snapshot zroot/keel/base/x@keel-2026-05-01: new roots are cloned from
// it, existing ones keep theirs, and an old snapshot can be destroyed once
// no root is cloned from it. Snapshots with other names (backups, automatic
// snapshots) are never used.
//
// # OCI images
//
// The driver is a nodeexec.ImageStore. AddImage creates
// <pool>/keel/images/<hex>, unpacks the image's layers (oci.Unpack) into
// its mountpoint, as zfs get mounted,mountpoint reports it, sets it
// readonly=on, and takes its snapshot @keel last, with the metadata as
// user properties of the snapshot (keel:manifest, keel:size,
// keel:unpacked, keel:added, keel:layers and keel:layers.<n>, 14 digests
// each, every value under 1024 bytes): zfs snapshot -o creates the
// snapshot and its properties at once. The snapshot is the mark of a whole
// image: HasImage, Images and Start take nothing else, a failed AddImage
// destroys the dataset, and a dataset left without its snapshot (an agent
// killed while unpacking) is destroyed and unpacked again by the next
// AddImage. An instance of an OCI image starts on a clone of
// <pool>/keel/images/<hex>@keel, its own and writable (a clone inherits
// from <pool>/keel/jails, not from the read-only image), so ten instances
// share the image's blocks. While a root is such a clone, ZFS refuses to
// destroy the image (zfs destroy -r, never -R), and RemoveImage returns
// an error wrapping nodeexec.ErrBusy that names the instances: the image
// goes once they are destroyed. An image must hold what a base does
// (/usr/bin/env, /sbin/ifconfig and /sbin/route for a vnet jail).
//
// # Instances
//
// Start provisions in the order of docs/freebsd-notes.md §1.9 (root, jail
// -c with vnet, devfs ruleset 4 and persist, volumes, network, limits,
// workload), each step idempotent; a provision that created the root and
// fails is undone in the order of §1.8. The workload is
// jexec keel-<name> /usr/bin/env -i <env> <command>: the base image must
// hold /usr/bin/env, /sbin/ifconfig and /sbin/route. Its environment is the
// one of nodeexec.InstanceEnv with PATH (FreeBSD's default unless the spec
// sets one), HOME=/root, and KEEL_VOLUME_<NAME> the volume's mount path
// inside the jail; KEEL_DRIVER_ROOT is not set. It runs as a child the
// driver waits for, in its own process group, with stdin /dev/null and
// stdout and stderr appended to log files capped at Options.LogMax.
//
// An instance runs while its jail holds a process that is not a zombie (a
// command that starts daemons and returns, as /etc/rc does, keeps it
// running). Its identity is its first process's PID and start time
// (ps -o lstart), recorded, so an agent restarted at any moment reports the
// same Process and adopts it. Stop signals every process of the jail
// (kill -s TERM, then KILL after the grace) and keeps the jail; Destroy
// removes the jail, its mounts, root and rctl rules, never a volume.
//
// # Network
//
// A vnet jail gets epair<N> (N a recorded ordinal that only grows, never
// one whose interface exists): the a-end on its bridge, the b-end in the
// jail with the instance's address on the /24 and a default route through
// the subnet's gateway, the .1, added to the bridge as an alias (and
// removed when the subnet's last jail is destroyed). A jail without vnet
// gets no network. VIPs are /32 aliases on the bridge; routes to peers'
// subnets are kernel routes. An alias or route is recorded under the state
// directory before the command that adds it; one that exists already
// without such a record is not Keel's and is never removed. The records
// are forgotten after a reboot (kern.boottime changed), which removed what
// they list.
//
// # Limits
//
// resources.cpu is rctl's pcpu (cores × 100, rounded; an amount rounding
// to 0 is refused) and resources.memory is vmemoryuse, both deny rules,
// re-applied by Apply (only what differs) and on every start, removed on
// destroy. With kern.racct.enable off, an instance with limits is refused
// with ErrRacctDisabled, never run unlimited.
//
// # Ingress redirect
//
// SetRedirects loads the pf anchor PFAnchor with one rdr rule per port of
// Options.PublicIface. The host's /etc/pf.conf must name the anchor (see
// PFAnchor); Check reports it when it does not.
package freebsd
