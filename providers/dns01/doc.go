// Package dns01 puts and removes the TXT records of ACME DNS-01 challenges
// through a DNS provider (OVH, Cloudflare, RFC 2136 with TSIG, or an exec
// hook), and waits until every authoritative server of the zone serves the
// record before the caller tells the CA.
//
// A provider is configured by a node-local file (Load) that holds its
// credentials; the credentials never leave the provider: they are not
// logged, not put in errors, and not passed to child processes except the
// values the exec hook's configuration names. The package reads no
// environment variable for its configuration.
//
// It does not talk to the CA (that is providers/acme's job) and keeps no
// state on disk.
package dns01
