// Package sync is Keel's side of git: it opens and fetches the cluster
// repository with go-git, reads the specs of a commit as an fs.FS, and reads
// and publishes node reports on their refs. Triggers, commit trust and the
// last good commit live here too as the agent grows.
//
// Code that also needs the standard library's sync package imports it as
// gosync.
package sync
