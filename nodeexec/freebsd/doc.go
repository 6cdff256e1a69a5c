// Package freebsd is the driver that runs instances as FreeBSD jails: ZFS
// clones for roots and volumes, VNET jails on the node's bridge over epair
// pairs, nullfs mounts, rctl limits, kernel routes, VIP aliases and a pf
// anchor for ingress. Every command goes through a Runner as an argv, so
// that the driver runs unchanged against the simulator (package fbsdsim)
// in tests. Each command shape, output format and error text it relies on
// cites FreeBSD's sources (freebsd/freebsd-src) in a comment.
package freebsd
